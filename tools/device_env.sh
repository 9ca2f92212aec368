#!/usr/bin/env bash
# Source this on the GPU machine (which reaches no package registry) before building: it unpacks
# the Debian packages fp4rl's build and tests need (Check, subunit, cJSON), carried in .devdeps/
# (fetch them here with: mkdir -p .devdeps && cd .devdeps && apt-get download check libsubunit0
# libsubunit-dev libcjson1 libcjson-dev), and installs the Python test tools if they are missing.
for f in .devdeps/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done
ldconfig
