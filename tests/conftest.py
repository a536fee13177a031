"""Suite-wide settings: property tests draw the same examples on every run (the suite is CI's gate and must
give the same verdict twice); ``HYPOTHESIS_PROFILE=explore pytest ...`` draws new random examples instead.
Calibrations are looked up in a cache directory that does not exist, so the onnxruntime target is the shipped
one whatever ``rlx-egraph calibrate`` cached on the machine (tests that need a cache set their own)."""

import os
import tempfile

from hypothesis import settings

from rlx_egraph.cost.calibration import CACHE_ENV

settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

os.environ[CACHE_ENV] = os.path.join(tempfile.gettempdir(), f"rlx-egraph-tests-{os.getpid()}-no-cache")
