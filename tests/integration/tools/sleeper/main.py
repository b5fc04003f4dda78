import json
import os
import subprocess
import sys
import time

params = json.load(sys.stdin)
child = subprocess.Popen(["sleep", "600"])
with open(params["pidfile"], "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
time.sleep(600)
