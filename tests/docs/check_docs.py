#!/usr/bin/python3
"""Checks the README and docs against the tree and the committed results.

  /usr/bin/python3 tests/docs/check_docs.py [--root DIR] [FILE.md ...]

Without files it reads README.md, docs/*.md and tests/bench/results/README.md.
Each failure is printed as FILE:LINE: what is wrong.

Links: every relative link ([text](target), ![alt](target)) resolves to a
file or folder of the tree, and a #anchor to a heading of the target file
(GitHub's heading ids).

Figures: a figure names its exact source in an HTML comment right after it,
which GitHub does not show:

  87.60<!--@heldout.json mlp.held_out.onebit_adam.mean-->

The file is a path under tests/bench/results/ (a sub-folder as
lm_long/x.json); the key a dotted path into its JSON, a list element by
index (rows.0.loss) or by a field (rows[name=adam].loss). A block that is
only <!--@@ FILE--> sets the file for the annotations that follow, up to the
next heading or the next such block; they then give the key alone. An
annotation may be arithmetic, its tokens separated by spaces
(a.mean - b.mean, x * 100), and a token FILE:KEY reads another file. The
figure (a unit such as x, % or " s" may stand between it and the comment)
must be what the expression gives at the precision shown (integers
included), by its sign when one is written, else by its magnitude.

A key part mean, median, min or max of a list of numbers gives that figure
of it (seconds.median). A .md file is read by one cell: FILE.md ROW | COLUMN
(the cell's first number; ROW | COLUMN #2 its second).

A block that is only <!--@@table FILE.md--> names the source of the table
below it: each cell's numbers must be those of the cell with the same row
label (first column) and column header in FILE.md; a column FILE.md lacks
may hold words and integers (settings), no decimals.

README.md, tests/bench/results/README.md and docs/benchmarks.md hold no
unsourced figure: every number with a decimal point outside code must be
annotated or in a sourced table. In the other docs that rule holds in each
block that names a results file (links to it or gives its path) and in a
table whose caption (the block just above it) does; a decimal in a block
that names none is a setting (a default, a flag's value).
"""
import argparse
import json
import os
import re
import statistics
import sys

RESULTS_DIR = os.path.join("tests", "bench", "results")
SOURCE_SUFFIXES = (".md", ".json", ".txt", ".csv")
STRICT = ("README.md", os.path.join(RESULTS_DIR, "README.md"),
          os.path.join("docs", "benchmarks.md"))

LINK_RE = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN_RE = re.compile(r"(`+)(.+?)\1")
FENCE_RE = re.compile(r"^\s*(```|~~~)")
NOTE_RE = re.compile(r"<!--@(?!@)(.*?)-->")
DEFAULT_RE = re.compile(r"^\s*<!--@@\s*(table\s+)?(\S+)\s*-->\s*$")
NUMBER_RE = re.compile(r"(?<![\w.])([+-]?)(\d+(?:\.\d+)?)(?![\w.]*\d)")
AGGREGATES = {"mean": statistics.mean, "median": statistics.median,
              "min": min, "max": max}
UNIT_RE = re.compile(r"^ ?[^\s\d]{0,6}$")
PATHISH_RE = re.compile(r"[\w./-]+\.(?:md|json|txt|csv)\b")
FILE_TOKEN_RE = re.compile(r"^(.+\.(?:json|md|txt|csv)):(.+)$")


class SourceError(Exception):
    pass


def github_slug(heading):
    """The id GitHub gives a heading: lower case, punctuation dropped,
    spaces to hyphens (inline code and links keep their text)."""
    text = LINK_RE.sub(lambda m: m.group(1), heading)
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def heading_slugs(text):
    slugs, seen, fenced = set(), {}, False
    for line in text.splitlines():
        if FENCE_RE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = github_slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            slugs.add(slug if n == 0 else "%s-%d" % (slug, n))
    return slugs


def blocks(text):
    """(first line number, [lines]) per block, fenced code left out."""
    out, current, start, fenced = [], [], 0, False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE_RE.match(line):
            if current:
                out.append((start, current))
                current = []
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.strip() == "":
            if current:
                out.append((start, current))
                current = []
            continue
        if not current:
            start = number
        current.append(line)
    if current:
        out.append((start, current))
    return out


def blank(line, regex, keep=None):
    """The line with each match of regex replaced by spaces (group `keep`
    kept), so that positions stay."""
    def sub(m):
        if keep is None:
            return " " * len(m.group(0))
        a, b = m.span(keep)
        s = m.start()
        return " " * (a - s) + m.group(keep) + " " * (m.end() - b)
    return regex.sub(sub, line)


def figures_of(line):
    """[(start, end, sign, digits, annotation or None)] for every number in
    the line outside code spans, link targets and annotations."""
    bare = blank(line, CODE_SPAN_RE)
    bare = blank(bare, LINK_RE, keep=1)
    notes = [(m.start(), m.group(1).strip()) for m in NOTE_RE.finditer(bare)]
    bare = blank(bare, NOTE_RE)
    bare = re.sub(r"<!--.*?-->", lambda m: " " * len(m.group(0)), bare)
    found = [[m.start(), m.end(), m.group(1), m.group(2), None]
             for m in NUMBER_RE.finditer(bare)]
    for at, note in notes:
        # The number just before it, a unit between them at most (16.9x,
        # 87.9%, 166 s).
        before = [f for f in found if f[1] <= at]
        if before and UNIT_RE.match(bare[before[-1][1]:at]):
            before[-1][4] = note
    return [tuple(f) for f in found]


def table_cells(line):
    cells = line.strip().strip("|").split("|")
    return [c.strip() for c in cells]


def is_table(lines):
    return all(l.lstrip().startswith("|") for l in lines)


def cell_numbers(cell):
    return [s + d for _, _, s, d, _ in figures_of(cell)]


def shown(value, sign, digits):
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    if sign:
        return "%+.*f" % (decimals, value)
    return "%.*f" % (decimals, abs(value))


class Checker:
    def __init__(self, root):
        self.root = os.path.abspath(root)
        self.results = os.path.join(self.root, RESULTS_DIR)
        self.cache = {}
        self.slugs = {}
        self.errors = []
        self.figures = []  # (doc, line, start, end): every checked figure

    def error(self, path, line, message):
        self.errors.append("%s:%d: %s" % (os.path.relpath(path, self.root), line, message))

    # Sources.
    def results_file(self, name):
        path = os.path.normpath(os.path.join(self.results, name))
        if not (path.startswith(self.results + os.sep) and os.path.isfile(path)):
            raise SourceError("no results file %s" % os.path.join(RESULTS_DIR, name))
        return path

    def load(self, path):
        if path not in self.cache:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            self.cache[path] = json.loads(text) if path.endswith(".json") else text
        return self.cache[path]

    def lookup(self, path, key):
        node = self.load(path)
        if not path.endswith(".json"):
            raise SourceError("%s is not JSON; key %s needs a .json file"
                              % (os.path.relpath(path, self.root), key))
        for part in key.split("."):
            m = re.match(r"^([^\[\]]*)(?:\[([^=\]]+)=([^\]]*)\])?$", part)
            if not m:
                raise SourceError("bad key part %r in %s" % (part, key))
            name, field, want = m.groups()
            if (name in AGGREGATES and field is None and isinstance(node, list)
                    and node and all(isinstance(x, (int, float)) for x in node)):
                node = AGGREGATES[name](node)
                continue
            try:
                if name:
                    node = node[int(name)] if isinstance(node, list) else node[name]
                if field is not None:
                    node = next(x for x in node if isinstance(x, dict)
                                and str(x.get(field)) == want)
            except (KeyError, IndexError, ValueError, TypeError, StopIteration):
                raise SourceError("%s has no %s" % (os.path.relpath(path, self.root), key))
        if isinstance(node, bool) or not isinstance(node, (int, float)):
            raise SourceError("%s %s is %r, not a number"
                              % (os.path.relpath(path, self.root), key, node))
        return float(node)

    def cell(self, path, key):
        """ROW | COLUMN[ #N]: the Nth number (first by default) of that cell
        of a table of a .md file."""
        m = re.match(r"^(.*?)\|(.*?)(?:#(\d+))?$", key)
        row, column = m.group(1).strip(), m.group(2).strip()
        text = self.source_table(path).get((row, column))
        if text is None:
            raise SourceError("%s has no row %r with column %r"
                              % (os.path.relpath(path, self.root), row, column))
        numbers = cell_numbers(text)
        n = int(m.group(3) or 1)
        if len(numbers) < n:
            raise SourceError("%s %s | %s holds %d number(s)"
                              % (os.path.relpath(path, self.root), row, column, len(numbers)))
        return float(numbers[n - 1])

    def evaluate(self, note, default):
        first = note.split(None, 1)
        if (first and first[0].endswith(".md") and len(first) == 2
                and "|" in first[1]):
            return self.cell(self.results_file(first[0]), first[1])
        tokens = note.replace("(", " ( ").replace(")", " ) ").split()
        if tokens and tokens[0].endswith(SOURCE_SUFFIXES):
            default = self.results_file(tokens.pop(0))
        if not tokens:
            raise SourceError("annotation %r names no key" % note)
        pos = [0]

        def peek():
            return tokens[pos[0]] if pos[0] < len(tokens) else None

        def take():
            pos[0] += 1
            return tokens[pos[0] - 1]

        def factor():
            t = take() if peek() is not None else None
            if t is None:
                raise SourceError("annotation %r ends early" % note)
            if t == "(":
                v = expr()
                if take() != ")":
                    raise SourceError("annotation %r: unbalanced (" % note)
                return v
            if t == "-":
                return -factor()
            if re.match(r"^\d+(\.\d+)?$", t):
                return float(t)
            m = FILE_TOKEN_RE.match(t)
            if m:
                return self.lookup(self.results_file(m.group(1)), m.group(2))
            if default is None:
                raise SourceError("annotation %r: no file (<!--@@ FILE--> or "
                                  "FILE first)" % note)
            return self.lookup(default, t)

        def term():
            v = factor()
            while peek() in ("*", "/"):
                op, w = take(), factor()
                v = v * w if op == "*" else v / w
            return v

        def expr():
            v = term()
            while peek() in ("+", "-"):
                op, w = take(), term()
                v = v + w if op == "+" else v - w
            return v

        value = expr()
        if peek() is not None:
            raise SourceError("annotation %r: unexpected %r" % (note, peek()))
        return value

    def source_table(self, path):
        """{(row label, header): cell} over every table of a .md file."""
        key = ("table", path)
        if key not in self.cache:
            cells = {}
            for _, lines in blocks(self.load(path)):
                if not is_table(lines) or len(lines) < 2:
                    continue
                header = table_cells(lines[0])
                for h in header[1:]:
                    cells[(h, "")] = ""  # the headers it has
                for line in lines[2:]:
                    row = table_cells(line)
                    for h, c in zip(header[1:], row[1:]):
                        cells.setdefault((row[0], h), c)
            self.cache[key] = cells
        return self.cache[key]

    # Checks.
    def check_links(self, doc, number, line):
        for m in LINK_RE.finditer(line):
            target = m.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # http:, https:, mailto:
            path_part, _, anchor = target.partition("#")
            if path_part:
                path = os.path.normpath(os.path.join(os.path.dirname(doc), path_part))
                if not os.path.exists(path):
                    self.error(doc, number, "link %s: no such file" % target)
                    continue
            else:
                path = doc
            if anchor and path.endswith(".md") and os.path.isfile(path):
                if path not in self.slugs:
                    with open(path, encoding="utf-8") as f:
                        self.slugs[path] = heading_slugs(f.read())
                if anchor not in self.slugs[path]:
                    self.error(doc, number, "link %s: no heading #%s in %s" % (
                        target, anchor, os.path.relpath(path, self.root)))

    def names_results(self, doc, text):
        names = [m.group(2) for m in LINK_RE.finditer(text)]
        names += [m.group(2) for m in CODE_SPAN_RE.finditer(text)]
        names += PATHISH_RE.findall(text)
        for name in names:
            name = name.strip().split("#", 1)[0]
            for base in (os.path.dirname(doc), self.root):
                path = os.path.normpath(os.path.join(base, name))
                if (os.path.isfile(path) and path.endswith(SOURCE_SUFFIXES)
                        and path.startswith(self.results + os.sep)
                        and os.path.basename(path) != "README.md"):
                    return True
        return False

    def check_figure(self, doc, number, figure, default):
        start, end, sign, digits, note = figure
        try:
            value = self.evaluate(note, default)
        except SourceError as e:
            self.error(doc, number, "figure %s%s: %s" % (sign, digits, e))
            return
        except ZeroDivisionError:
            self.error(doc, number, "figure %s%s: %r divides by zero" % (sign, digits, note))
            return
        if shown(value, sign, digits) != sign + digits:
            self.error(doc, number, "figure %s%s: %s gives %.6g (%s at the "
                       "precision shown)" % (sign, digits, note, value,
                                             shown(value, sign, digits)))

    def check_table(self, doc, start, lines, source):
        try:
            path = self.results_file(source)
        except SourceError as e:
            self.error(doc, start, "table: %s" % e)
            return
        cells = self.source_table(path)
        header = table_cells(lines[0])
        for offset, line in enumerate(lines[2:], 2):
            row = table_cells(line)
            for h, c in zip(header[1:], row[1:]):
                mine = cell_numbers(c)
                if not mine:
                    continue
                theirs = cells.get((row[0], h))
                if theirs is None and (h, "") not in cells and not any(
                        "." in n for n in mine):
                    continue  # a column of words (and settings) of its own
                if theirs is None:
                    self.error(doc, start + offset, "table cell %r / %r: no such "
                               "row and column in %s" % (row[0], h, source))
                elif mine != cell_numbers(theirs):
                    self.error(doc, start + offset, "table cell %r / %r: %s, "
                               "but %s has %s" % (row[0], h, " ".join(mine),
                                                  source, " ".join(cell_numbers(theirs))))

    def check(self, doc, text=None):
        if text is None:
            with open(doc, encoding="utf-8") as f:
                text = f.read()
        strict = os.path.relpath(doc, self.root) in STRICT
        default, table_source, captioned = None, None, False
        for start, lines in blocks(text):
            for offset, line in enumerate(lines):
                self.check_links(doc, start + offset, line)
            if any(re.match(r"^#{1,6}\s", l) for l in lines):
                default = None
            m = DEFAULT_RE.match(lines[0]) if len(lines) == 1 else None
            if m:
                if m.group(1):
                    table_source = m.group(2)
                else:
                    try:
                        default = self.results_file(m.group(2))
                    except SourceError as e:
                        self.error(doc, start, str(e))
                continue
            table = is_table(lines) and len(lines) >= 2
            if table and table_source:
                self.check_table(doc, start, lines, table_source)
            names = self.names_results(doc, "\n".join(lines))
            # A table is named by its caption, the block just above it.
            needs_source = strict or names or (table and captioned)
            captioned = names
            for offset, line in enumerate(lines):
                number = start + offset
                bars = [i for i, ch in enumerate(line) if ch == "|"]
                label_end = bars[1] if table and len(bars) > 1 else 0
                for figure in figures_of(line):
                    s, e, sign, digits, note = figure
                    if note is not None:
                        self.figures.append((doc, number, s, e))
                        self.check_figure(doc, number, figure, default)
                    elif table and table_source and offset >= 2:
                        if s > label_end:  # labels are matched, not checked
                            self.figures.append((doc, number, s, e))
                    elif "." in digits and needs_source and not (table and offset < 2):
                        self.error(doc, number, "figure %s%s names no source "
                                   "(<!--@FILE KEY--> after it)" % (sign, digits))
            table_source = None  # it names the block right below it only


def default_files(root):
    files = [os.path.join(root, "README.md"), os.path.join(root, RESULTS_DIR, "README.md")]
    docs = os.path.join(root, "docs")
    files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    return files


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    parser.add_argument("files", nargs="*")
    args = parser.parse_args()
    checker = Checker(args.root)
    files = args.files or default_files(checker.root)
    for doc in files:
        if not os.path.isfile(doc):
            print("check_docs: no such file: %s" % doc, file=sys.stderr)
            return 2
        checker.check(os.path.abspath(doc))
    for e in checker.errors:
        print(e)
    print("check_docs: %d file(s), %d figure(s), %d problem(s)"
          % (len(files), len(checker.figures), len(checker.errors)))
    return 1 if checker.errors else 0


if __name__ == "__main__":
    sys.exit(main())
