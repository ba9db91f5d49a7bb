#!/usr/bin/env bash
# docs_links: the links between README.md and docs/*.md lead somewhere.
# Every relative link [text](path), [text](path#anchor) or [text](#anchor)
# outside code names a file or directory that exists, and its anchor is
# the one a heading of that Markdown file gets (GitHub's rule: lower case,
# punctuation dropped, spaces to hyphens, -1, -2 ... for repeats), so that
# moving or renaming a section cannot strand a link to it.
#   usage: docs_links.sh LEASE_BINARY SOURCE_DIR
. "$(dirname "$0")/../cli/lib.sh" "$1"
SRC=${2:?usage: $0 LEASE_BINARY SOURCE_DIR}
SRC=$(cd "$SRC" && pwd) || die "no source directory $2"
command -v python3 >/dev/null 2>&1 || die "'python3' is required by this test but was not found in PATH"

section "links of README.md and docs/*.md"
call python3 - "$SRC" <<'PYEOF'
import os, re, sys

src = sys.argv[1]
files = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(src, "docs"))
                               if f.endswith(".md"))

def prose(path):
    """The lines outside fenced code, with inline code removed."""
    out, fence = [], None
    with open(os.path.join(src, path), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = re.match(r" {0,3}(```+|~~~+)", line)
            if m:
                if fence is None:
                    fence = m.group(1)[0] * len(m.group(1))
                elif line.strip().startswith(fence):
                    fence = None
                continue
            if fence is None:
                out.append((n, re.sub(r"`[^`]*`", "", line)))
    return out

def anchors(path):
    seen, result = {}, set()
    for _, line in prose(path):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        k = seen.get(slug, 0)
        seen[slug] = k + 1
        result.add(slug if k == 0 else "%s-%d" % (slug, k))
    return result

bad = checked = 0
for path in files:
    for n, line in prose(path):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue
            checked += 1
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(os.path.join(src, dest)):
                print("%s:%d: (%s): no file %s" % (path, n, target, dest))
                bad += 1
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                print("%s:%d: (%s): no heading of %s has the anchor #%s" % (path, n, target, dest, anchor))
                bad += 1
print("checked %d links" % checked)
sys.exit(1 if bad else 0)
PYEOF
echo "$OUT"
expect_rc 0 "every relative link leads to a file and a heading"
assert_match "$OUT" 'checked [1-9][0-9]* links' "links were found"

finish
