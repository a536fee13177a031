"""Front ends that bring models from other formats into MIR and back."""
