"""Suite-wide settings, inherited by every rank the tests start.

None of hocc's: the suite runs the defaults users get, auto's measured
selection included (HOCC_TUNE=1). A test that needs a fixed plan pins it
itself and says why."""
