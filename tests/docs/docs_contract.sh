#!/usr/bin/env bash
# docs_contract: every test docs/contract.md names exists, so that the page
# cannot go on citing a check that was renamed or removed.
#  - a test function, `test_name` in backticks: a C function of that name
#    is defined in a .c file under tests/ and used there besides its
#    definition (registered with cmocka, or called by its program's main);
#    when the names are followed by "(file.c)", each is defined in a file
#    of that name;
#  - a path, `tests/...` in backticks: the file or directory exists.
# The page must cite test functions of each of the five conformance
# programs, so that an empty or mangled page cannot pass.
#   usage: docs_contract.sh LEASE_BINARY SOURCE_DIR
. "$(dirname "$0")/../cli/lib.sh" "$1"
SRC=${2:?usage: $0 LEASE_BINARY SOURCE_DIR}
SRC=$(cd "$SRC" && pwd) || die "no source directory $2"
command -v python3 >/dev/null 2>&1 || die "'python3' is required by this test but was not found in PATH"
[ -f "$SRC/docs/contract.md" ] || die "no docs/contract.md in $SRC"

section "the tests named by docs/contract.md"
call python3 - "$SRC" <<'PYEOF'
import os, re, sys

src = sys.argv[1]
tests = os.path.join(src, "tests")

# Every C source under tests/: where each test_* function is defined, and
# how often each name occurs at all.
defined = {}   # name -> set of file names (basenames)
uses = {}      # name -> occurrences in tests/
for root, _, files in os.walk(tests):
    for f in files:
        if not f.endswith((".c", ".h")):
            continue
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        if f.endswith(".c"):
            for m in re.finditer(r"^(?:static\s+)?(?:void|int)\s+(test_\w+)\s*\(", text, re.M):
                defined.setdefault(m.group(1), set()).add(f)
        for m in re.finditer(r"\btest_\w+\b", text):
            uses[m.group(0)] = uses.get(m.group(0), 0) + 1

with open(os.path.join(src, "docs", "contract.md"), encoding="utf-8") as fh:
    doc = fh.read()

bad = 0
cited = set()
by_file = {}

# Names followed by their file: `test_a`, `test_b` (file.c)
group = re.compile(r"((?:`test_\w+`(?:,\s*|\s+and\s+|\s*))+)\(([\w.-]+\.c)\)")
for m in group.finditer(doc):
    for name in re.findall(r"`(test_\w+)`", m.group(1)):
        by_file.setdefault(name, set()).add(m.group(2))

for name in sorted(set(re.findall(r"`(test_\w+)`", doc))):
    cited.add(name)
    if name not in defined:
        print("docs/contract.md names %s: no test function of that name in tests/" % name)
        bad += 1
        continue
    if uses.get(name, 0) < 2:
        print("docs/contract.md names %s: defined in %s but never run there"
              % (name, ", ".join(sorted(defined[name]))))
        bad += 1
    for f in sorted(by_file.get(name, ())):
        if f not in defined[name]:
            print("docs/contract.md names %s (%s): it is defined in %s"
                  % (name, f, ", ".join(sorted(defined[name]))))
            bad += 1

paths = sorted(set(re.findall(r"`(tests/[^`\s]+)`", doc)))
for p in paths:
    if not os.path.exists(os.path.join(src, p)):
        print("docs/contract.md names %s: no such file or directory" % p)
        bad += 1

for prog in ("conformance.c", "keeper.c", "election.c", "history.c", "session.c"):
    if not any(prog in files for n, files in by_file.items() if n in defined):
        print("docs/contract.md cites no test of tests/conformance/%s" % prog)
        bad += 1

print("checked %d test functions and %d paths" % (len(cited), len(paths)))
sys.exit(1 if bad else 0)
PYEOF
echo "$OUT"
expect_rc 0 "every test docs/contract.md names exists"
assert_match "$OUT" 'checked [1-9][0-9]* test functions and [1-9][0-9]* paths' \
    "test functions and paths were found"

finish
