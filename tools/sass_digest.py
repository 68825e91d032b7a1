"""Digest the device code of NVIDIA objects per kernel, to show that a refactor left it identical.

    python3 tools/sass_digest.py OUT.json build/nvidia/forward.o build/nvidia/backward.o
    python3 tools/sass_digest.py --compare BEFORE.json AFTER.json

`cuobjdump -sass` lists each architecture's functions; each function's instructions (the text
and the encodings, no line information) are hashed with md5 under "<object file name> <arch> <function>". With
--compare, the two digests must name the same functions with the same hashes: exit 0 and a
one-line summary, or exit 1 listing what differs. Needs cuobjdump (the CUDA toolkit's).
"""

import hashlib
import json
import os
import re
import subprocess
import sys


def digest(paths):
    out = {}
    for path in paths:
        text = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout
        arch, name, body = None, None, []

        def flush():
            if name is not None:
                key = f"{os.path.basename(path)} {arch} {name}"
                if key in out:
                    raise SystemExit(f"sass_digest: {key} appears twice")
                out[key] = hashlib.md5("\n".join(body).encode()).hexdigest()

        for line in text.splitlines():
            m = re.match(r"\s*arch = (\S+)", line)
            if m:
                flush()
                arch, name, body = m.group(1), None, []
                continue
            m = re.match(r"\s*Function : (\S+)", line)
            if m:
                flush()
                name, body = m.group(1), []
                continue
            if name is not None and line.strip():
                body.append(line.strip())
        flush()
    return out


def compare(before, after):
    a, b = (json.load(open(p)) for p in (before, after))
    missing, extra = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    changed = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    for label, keys in (("only before", missing), ("only after", extra), ("changed", changed)):
        for k in keys[:20]:
            print(f"{label}: {k}")
    same = not (missing or extra or changed)
    print(f"sass_digest: {len(a)} functions before, {len(b)} after; {len(changed)} changed, {len(missing)} gone, "
          f"{len(extra)} new: {'IDENTICAL' if same else 'DIFFERENT'}")
    return 0 if same else 1


def main(argv):
    if argv[:1] == ["--compare"] and len(argv) == 3:
        return compare(argv[1], argv[2])
    if len(argv) < 2:
        sys.exit(__doc__)
    d = digest(argv[1:])
    with open(argv[0], "w") as f:
        json.dump(d, f, indent=0, sort_keys=True)
    archs = sorted({k.split()[1] for k in d})
    print(f"sass_digest: {len(d)} functions ({', '.join(archs)}) -> {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
