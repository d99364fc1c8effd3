"""Suite-wide settings, inherited by every rank the tests start."""

import os

# auto's measured selection off unless a test asks for it (tests/test_tuning.py does): each of a world's
# many sizes would run its trials, and tests of the model's picks want the model's
os.environ.setdefault("HOCC_TUNE", "0")
