import sys

sys.stdin.read()
blob = bytearray(512 * 1024 * 1024)
print(len(blob))
