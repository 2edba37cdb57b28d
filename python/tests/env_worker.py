"""A worker script for test_launch_prep.py, run by pserver.launch.

    env_worker.py OUT_DIR NAME...

Writes OUT_DIR/rank<RANK>.json: the value of each environment variable NAME
(null when unset). Contacts no shard.
"""

import json
import os
import sys

out, names = sys.argv[1], sys.argv[2:]
with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump({n: os.environ.get(n) for n in names}, f)
