#!/bin/sh
# Builds dist/{{name}}.wasm, a WebAssembly component with a Python interpreter.
# Needs componentize-py: pip install componentize-py==0.25.1
set -eu
cd "$(dirname "$0")"
mkdir -p dist
componentize-py -d wit -w local:{{name}}/{{name}} componentize app -o dist/{{name}}.wasm
echo "built dist/{{name}}.wasm"
