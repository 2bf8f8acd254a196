#!/usr/bin/env python3
"""check_doc_links.py SOURCE_DIR: every relative link in the repository's Markdown pages reaches a
file or folder of the repository, and a link with #section a heading of the page it names (GitHub's
anchors: lower case, punctuation dropped, spaces as hyphens, repeats numbered). README.md stays a
front door: 300 lines at most. Links to the web are not followed (no network in the tests)."""
import os
import re
import subprocess
import sys
import tempfile

LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')
MAX_README_LINES = 300


def pages(root):
    """The Markdown files git knows (a checkout), or every one under root (a copy without .git)."""
    try:
        out = subprocess.run(['git', '-C', root, 'ls-files', '-co', '--exclude-standard', '*.md'],
                             capture_output=True, text=True, check=True).stdout.split()
        if out:
            return sorted(out)
    except (OSError, subprocess.CalledProcessError):
        pass
    found = []
    for d, subdirs, files in os.walk(root):
        subdirs[:] = [s for s in subdirs if not s.startswith(('.', 'build', 'Testing'))]
        found += [os.path.relpath(os.path.join(d, f), root) for f in files if f.endswith('.md')]
    return sorted(found)


def prose(text):
    """The page's lines outside fenced code blocks."""
    fenced = False
    for line in text.split('\n'):
        if line.startswith('```'):
            fenced = not fenced
        elif not fenced:
            yield line


def anchors(text):
    seen, out = {}, set()
    for line in prose(text):
        m = re.match(r'#{1,6}\s+(.*?)\s*#*\s*$', line)
        if not m:
            continue
        slug = re.sub(r'[^\w\- ]', '', m.group(1).lower()).replace(' ', '-')
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f'{slug}-{n}')
    return out


def check(root):
    """The list of broken links (and an overlong README), and how many links were checked."""
    errors, checked = [], 0
    for page in pages(root):
        text = open(os.path.join(root, page), encoding='utf-8').read()
        fenced = False
        for lineno, line in enumerate(text.split('\n'), 1):
            if line.startswith('```'):
                fenced = not fenced
            if fenced or line.startswith('```'):
                continue
            for target in LINK.findall(line):
                if re.match(r'[a-z][a-z0-9+.-]*:', target):   # https:, mailto:
                    continue
                checked += 1
                path, _, section = target.partition('#')
                dest = os.path.normpath(os.path.join(os.path.dirname(os.path.join(root, page)), path)) \
                    if path else os.path.join(root, page)
                if not dest.startswith(root):
                    errors.append(f'{page}:{lineno}: {target} leaves the repository')
                elif not os.path.exists(dest):
                    errors.append(f'{page}:{lineno}: {target}: no such file')
                elif section:
                    if not dest.endswith('.md'):
                        errors.append(f'{page}:{lineno}: {target}: a section of a page that is not Markdown')
                    elif section not in anchors(open(dest, encoding='utf-8').read()):
                        errors.append(f'{page}:{lineno}: {target}: {os.path.relpath(dest, root)} '
                                      f'has no heading "#{section}"')
    lines = open(os.path.join(root, 'README.md'), encoding='utf-8').read().count('\n')
    if lines > MAX_README_LINES:
        errors.append(f'README.md has {lines} lines; the front door keeps to {MAX_README_LINES} '
                      '(move the detail to docs/)')
    return errors, checked, lines


def planted():
    """The check itself finds a missing file, a missing section and a long README in a copy."""
    with tempfile.TemporaryDirectory() as d:
        os.mkdir(os.path.join(d, 'docs'))
        open(os.path.join(d, 'docs', 'A.md'), 'w').write('# A page\n\n## Its part (one)\n')
        body = ('[ok](docs/A.md#its-part-one) [gone](docs/B.md) [no part](docs/A.md#nowhere)\n'
                '```\n[in code](nowhere.md)\n```\n[web](https://example.com/x)\n')
        open(os.path.join(d, 'README.md'), 'w').write(body + '\n' * MAX_README_LINES)
        errors, checked, _ = check(d)
        want = ['docs/B.md: no such file', 'has no heading "#nowhere"', 'README.md has 305 lines']
        if checked != 3 or len(errors) != 3 or not all(any(w in e for e in errors) for w in want):
            print('FAIL: the check missed what was planted:', checked, errors)
            return False
    return True


def main():
    if not planted():
        return 1
    errors, checked, lines = check(os.path.abspath(sys.argv[1]))
    for e in errors:
        print('FAIL:', e)
    if errors:
        return 1
    print(f'ok: {checked} links in the repository\'s pages reach their files and sections; '
          f'README.md has {lines} lines')
    return 0


if __name__ == '__main__':
    sys.exit(main())
