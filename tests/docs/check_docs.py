#!/usr/bin/python3
"""Checks the README and docs against the tree and the committed results.

  /usr/bin/python3 tests/docs/check_docs.py [--root DIR] [FILE.md ...]

Without files it reads README.md, docs/*.md and tests/bench/results/README.md.
Two checks, each failure printed as FILE:LINE: what is wrong.

Links: every relative link ([text](target), ![alt](target)) resolves to a
file or folder of the tree, and a #anchor to a heading of the target file
(GitHub's heading ids).

Figures: the text is cut into blocks at blank lines (fenced code is left
out). A block names a results file when it links to, or gives the path or
the backticked name of, a .md, .json, .txt or .csv file under
tests/bench/results/ or a folder of it (READMEs excepted); a table with none is named by
the block just above it (its caption). In such a block every number with a
decimal point outside backticks (87.94, 3.46x, +1.39%) must be a number of
one of the named files at the figure's precision; a fraction in the file
also matches its percentage (0.8794 for 87.94). In README.md every block
with such a number must name a results file: each figure on the front page
says where it comes from.
"""
import argparse
import bisect
import os
import re
import sys

RESULTS_DIR = os.path.join("tests", "bench", "results")
SOURCE_SUFFIXES = (".md", ".json", ".txt", ".csv")

LINK_RE = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN_RE = re.compile(r"(`+)(.+?)\1")
FENCE_RE = re.compile(r"^\s*(```|~~~)")
FIGURE_RE = re.compile(r"(?<![\w.])[+-]?(\d+\.\d+)(?![\w.]*\d)")
FILE_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
PATHISH_RE = re.compile(r"[\w./-]+\.(?:md|json|txt|csv)\b")


def github_slug(heading):
    """The id GitHub gives a heading: lower case, punctuation dropped,
    spaces to hyphens (inline code and links keep their text)."""
    text = LINK_RE.sub(lambda m: m.group(1), heading)
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def heading_slugs(path):
    slugs, seen, fenced = set(), {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
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


def blocks(path):
    """(first line number, [lines]) per block, fenced code left out."""
    out, current, start, fenced = [], [], 0, False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
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
            current.append(line.rstrip("\n"))
    if current:
        out.append((start, current))
    return out


class Checker:
    def __init__(self, root):
        self.root = os.path.abspath(root)
        self.results = os.path.join(self.root, RESULTS_DIR)
        self.numbers = {}
        self.slugs = {}
        self.errors = []

    def error(self, path, line, message):
        self.errors.append("%s:%d: %s" % (os.path.relpath(path, self.root), line, message))

    def file_numbers(self, path):
        if path not in self.numbers:
            with open(path, encoding="utf-8", errors="replace") as f:
                values = sorted(abs(float(v)) for v in FILE_NUMBER_RE.findall(f.read()))
            self.numbers[path] = values
        return self.numbers[path]

    def matches(self, figure, sources):
        value = abs(float(figure))
        decimals = len(figure.split(".")[1])
        slack = 0.5 * 10 ** -decimals + 1e-9
        for source in sources:
            values = self.file_numbers(source)
            for want in (value, value / 100.0):
                s = slack if want == value else slack / 100.0
                i = bisect.bisect_left(values, want - s)
                if i < len(values) and values[i] <= want + s:
                    return True
        return False

    def resolve(self, doc, target):
        """The file a link target or a named path refers to, or None."""
        target = target.split("#", 1)[0]
        if not target:
            return None
        for base in (os.path.dirname(doc), self.root):
            candidate = os.path.normpath(os.path.join(base, target))
            if os.path.exists(candidate):
                return candidate
        return None

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
                    self.slugs[path] = heading_slugs(path)
                if anchor not in self.slugs[path]:
                    self.error(doc, number, "link %s: no heading #%s in %s" % (
                        target, anchor, os.path.relpath(path, self.root)))

    def sources_of(self, doc, text):
        names = [m.group(2) for m in LINK_RE.finditer(text)]
        names += [m.group(2) for m in CODE_SPAN_RE.finditer(text)]
        names += PATHISH_RE.findall(text)
        found = []
        for name in names:
            path = self.resolve(doc, name.strip())
            if (path and os.path.isfile(path) and path.endswith(SOURCE_SUFFIXES)
                    and (os.path.dirname(path) + os.sep).startswith(
                        self.results + os.sep)
                    and os.path.basename(path) != "README.md"
                    and path not in found):
                found.append(path)
        return found

    def check(self, doc):
        strict = os.path.relpath(doc, self.root) == "README.md"
        previous_sources = []
        for start, lines in blocks(doc):
            for offset, line in enumerate(lines):
                self.check_links(doc, start + offset, line)
            text = "\n".join(lines)
            sources = self.sources_of(doc, text)
            is_table = all(l.lstrip().startswith("|") for l in lines)
            if not sources and is_table:
                sources = previous_sources
            for offset, line in enumerate(lines):
                bare = CODE_SPAN_RE.sub(" ", line)
                bare = LINK_RE.sub(lambda m: " " + m.group(1) + " ", bare)
                for m in FIGURE_RE.finditer(bare):
                    figure = m.group(1)
                    if not sources:
                        if strict:
                            self.error(doc, start + offset,
                                       "figure %s: its block names no results file "
                                       "(tests/bench/results/...)" % figure)
                        continue
                    if not self.matches(figure, sources):
                        self.error(doc, start + offset, "figure %s is in none of %s" % (
                            figure, ", ".join(os.path.relpath(s, self.root) for s in sources)))
            previous_sources = sources


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    parser.add_argument("files", nargs="*")
    args = parser.parse_args()
    checker = Checker(args.root)
    files = args.files
    if not files:
        files = [os.path.join(checker.root, "README.md"),
                 os.path.join(checker.results, "README.md")]
        docs = os.path.join(checker.root, "docs")
        files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    for doc in files:
        if not os.path.isfile(doc):
            print("check_docs: no such file: %s" % doc, file=sys.stderr)
            return 2
        checker.check(os.path.abspath(doc))
    for e in checker.errors:
        print(e)
    print("check_docs: %d file(s), %d problem(s)" % (len(files), len(checker.errors)))
    return 1 if checker.errors else 0


if __name__ == "__main__":
    sys.exit(main())
