#!/bin/sh
# Builds dist/{{name}}.wasm, a WebAssembly component with a JavaScript engine.
# Needs Node.js 18 or later; installs componentize-js from npm the first time.
set -eu
cd "$(dirname "$0")"
if [ ! -d node_modules/@bytecodealliance/componentize-js ]; then
  echo "installing componentize-js from npm"
  npm install --no-audit --no-fund --loglevel=error
fi
mkdir -p dist
npx --no-install componentize-js app.js --wit wit --world-name {{name}} --out dist/{{name}}.wasm
echo "built dist/{{name}}.wasm"
