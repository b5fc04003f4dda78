import json
import os
import sys

wanted = json.load(sys.stdin)["mib"]
written, refusal = 0, None
chunk = b"x" * (1024 * 1024)
for index in range(wanted):
    for folder in (".", "/tmp"):
        try:
            with open(os.path.join(folder, f"fill-{index}.bin"), "wb") as file:
                file.write(chunk)
            written += 1
            break
        except OSError as error:
            refusal = error.strerror
    else:
        break
print(json.dumps({"written_mib": written, "refusal": refusal}))
