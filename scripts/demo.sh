#!/usr/bin/env bash
# The main job on the embedded default: local folders, in-process, no services.
#   bash scripts/demo.sh [WORKDIR]
# Installs mcbridge with its cloud extras ([all]) into .venv (if needed), makes a small corpus and a 64 MiB checkpoint,
# copies them with `mcbridge cp`, proves the copy with `mcbridge verify --deep`, and shows a
# `mcbridge sync` that sends only a changed file. A WORKDIR given is kept for a look; the temporary
# one made otherwise (~150 MiB: the corpus and its copy) is removed when the demo ends.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=${PYTHON:-python3}
if [ $# -ge 1 ]; then
    work=$1
else
    work=$(mktemp -d -t mcbridge-demo.XXXXXX)
    trap 'rm -rf "$work"; echo "==> removed $work (give a WORKDIR to keep it)"' EXIT
fi

if [ ! -x .venv/bin/mcbridge ] || ! .venv/bin/python -c 'import s3fs, gcsfs, azure.storage.blob, pyarrow' 2>/dev/null; then
    echo "==> installing mcbridge into .venv"
    [ -x .venv/bin/python ] || "$python" -m venv .venv
    .venv/bin/python -m pip install --disable-pip-version-check -q -U pip
    .venv/bin/python -m pip install --disable-pip-version-check -q -e '.[all]'
fi
export PATH="$PWD/.venv/bin:$PATH"
export MCBRIDGE_STATE_DIR="$work/state"

echo "==> making a corpus in $work/corpus (2,000 small files, one 64 MiB checkpoint)"
.venv/bin/python - "$work/corpus" <<'PY'
import os, sys
root = sys.argv[1]
for i in range(2000):
    d = os.path.join(root, "shards", f"{i // 100:03d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"sample-{i:05d}.json"), "w") as f:
        f.write('{"id": %d, "text": "%s"}\n' % (i, "lorem ipsum " * (i % 50)))
os.makedirs(os.path.join(root, "checkpoints"), exist_ok=True)
with open(os.path.join(root, "checkpoints", "model-step-1000.safetensors"), "wb") as f:
    f.write(os.urandom(64 * 1024 * 1024))
PY

echo "==> mcbridge cp $work/corpus/ $work/replica/"
mcbridge cp "$work/corpus/" "$work/replica/"
echo "==> mcbridge verify --deep $work/replica/"
mcbridge verify --deep "$work/replica/"
echo "==> one file changes at the source; mcbridge sync sends only that one"
echo '{"id": 7, "text": "edited"}' > "$work/corpus/shards/000/sample-00007.json"
mcbridge sync "$work/corpus/" "$work/replica/"
newest=$(ls "$work/replica/_bridge/log/" | sort | tail -n 1)
echo "==> the record: one commit per job under _bridge/log/ (each written last, its commit marker): $newest"
head -c 600 "$work/replica/_bridge/log/$newest"; echo; echo "..."
