"""Build hook: pure Python for now (the compiled core is added by the mypyc build)."""

from setuptools import setup

setup()
