"""manifest_edit.py - edits a checkpoint's manifest.json the way a test
needs to, then seals it again as meshrun does, so what a test damages is
what it means to damage (a record, a field) and not the seal.

    python3 manifest_edit.py STEP_DIR 'CODE'          CODE runs with m bound to
                                                       the parsed manifest
    python3 manifest_edit.py --unsealed STEP_DIR 'CODE'  ... written without
                                                       the seal's update: the
                                                       damage a reader must see

The seal (docs/CHECKPOINTS.md): the file is the manifest dumped compactly
with a last member "manifest_crc32c", the CRC-32C (Castagnoli) of every byte
before that member's comma. The CRC here is an independent bitwise
implementation, not meshrun's table.
"""
import json
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def main(argv):
    unsealed = argv[:1] == ["--unsealed"]
    if unsealed:
        argv = argv[1:]
    if len(argv) != 2:
        sys.exit(__doc__)
    path = argv[0] + "/manifest.json"
    with open(path, "rb") as f:
        text = f.read()
    m = json.loads(text)
    old = m.pop("manifest_crc32c", None)
    exec(argv[1], {"m": m})  # pylint: disable=exec-used
    body = json.dumps(m, separators=(",", ":")).encode()[:-1]
    seal = old if unsealed else crc32c(body)
    with open(path, "wb") as f:
        f.write(body + b',"manifest_crc32c":%d}\n' % seal)


if __name__ == "__main__":
    main(sys.argv[1:])
