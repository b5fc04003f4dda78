import os
import sys
import time

sys.stdin.read()
held = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        held += 1
except OSError:
    pass
print(held, flush=True)
time.sleep(600)
