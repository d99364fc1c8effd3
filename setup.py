"""Build entry point. Pure Python for now; the C++/CUDA extension (csrc/) is
added here as an optional ext_module so that a CPU-only install still works."""

from setuptools import setup

setup()
