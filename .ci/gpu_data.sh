#!/usr/bin/env bash
# Builds .data/corpus.jsonl.gz (git-ignored) for the device's gpu_quick stage, so its runs do not read the
# built-in corpus (3M tokens on the device image) 25 times: the Python source of this machine's virtual
# environment (open-source packages, sorted paths, one document per file; nothing downloaded), up to
# GPU_DATA_MB megabytes compressed (default 36: with .whl's ~12 MB and the tracked tree it stays under the
# device tool's 64 MiB). Carry it with the wheels: run(carry=[".whl", ".data"]). docs/recipe-one-gpu.md, section 6.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .data
grep -qx '/.data/' .git/info/exclude 2>/dev/null || echo /.data/ >> "$(git rev-parse --git-common-dir)/info/exclude"
SITE=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
python3 - "$SITE" "${GPU_DATA_MB:-36}" <<'PY'
import gzip, json, os, pathlib, sys
site, limit = pathlib.Path(sys.argv[1]), float(sys.argv[2]) * 1e6
out_path = ".data/corpus.jsonl.gz"
raw = files = 0
with open(out_path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9) as out:
    for p in sorted(site.rglob("*.py")):
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) < 200:
            continue
        line = (json.dumps({"text": text}) + "\n").encode()
        out.write(line); raw += len(line); files += 1
        if f.tell() > limit:
            break
print(f"{out_path}: {files} files, {raw / 1e6:.0f} MB of text, {os.path.getsize(out_path) / 1e6:.1f} MB compressed")
PY
