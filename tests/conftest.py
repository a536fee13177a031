"""Suite-wide settings: property tests draw the same examples on every run (the suite is CI's gate and must
give the same verdict twice); ``HYPOTHESIS_PROFILE=explore pytest ...`` draws new random examples instead."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
