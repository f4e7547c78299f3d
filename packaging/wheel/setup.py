"""The wheel holds native programs, not Python: its tag is py3-none-manylinux_2_31_x86_64 (x86-64 code for glibc >=
2.31, checked by scripts/release.sh with readelf, independent of the Python version), and its scripts are copied
byte for byte (setuptools would read them as Python source to rewrite a #! line)."""
import os

from setuptools import setup
from wheel.bdist_wheel import bdist_wheel

try:
    from setuptools.command.build_scripts import build_scripts
except ImportError:  # setuptools < 69 (Debian 12: 66): distutils' own, which setuptools provides
    from distutils.command.build_scripts import build_scripts


class PlatformWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return "py3", "none", "manylinux_2_31_x86_64"


class CopyPrograms(build_scripts):
    def copy_scripts(self):
        self.mkpath(self.build_dir)
        copied = []
        for script in self.scripts:
            target = os.path.join(self.build_dir, os.path.basename(script))
            self.copy_file(script, target)  # keeps the mode: executable
            copied.append(target)
        return copied, copied


setup(cmdclass={"bdist_wheel": PlatformWheel, "build_scripts": CopyPrograms})
