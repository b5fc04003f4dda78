import json
import mmap
import resource
import sys

sys.stdin.read()


def limit(kind):
    soft, _ = resource.getrlimit(kind)
    return None if soft == resource.RLIM_INFINITY else soft


try:
    mmap.mmap(-1, 3 * 1024**3).close()
    reserved = True
except OSError:
    reserved = False
print(json.dumps({"memory": limit(resource.RLIMIT_AS), "cpu": limit(resource.RLIMIT_CPU),
                  "processes": limit(resource.RLIMIT_NPROC),
                  "file": limit(resource.RLIMIT_FSIZE), "reserved_3gib": reserved}))
