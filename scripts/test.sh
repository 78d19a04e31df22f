#!/usr/bin/env bash
# Run the whole test suite: unit tests, then the integration tier (real MiniLM, real vLLM server,
# headless Chromium). "No tests ran" counts as a failure. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HAYSTACK_TELEMETRY_ENABLED=False
mkdir -p test-output
set +e
.venv/bin/python -m pytest -p no:cacheprovider --junitxml=test-output/junit.xml "$@"
status=$?
set -e
if [ "$status" = 5 ]; then echo "test.sh: no tests ran; that is a failure" >&2; exit 1; fi
exit "$status"
