"""Builds the aligned Spanish→English Bible corpus from Debian's SWORD modules.

Reads `sword-text-sparv` (Reina-Valera 1909) and `sword-text-kjv` (King James) with
pysword, strips OSIS markup, drops empty verses and verses whose Strong's numbers show
that the two modules number them differently, and writes `ref<TAB>es<TAB>en` TSVs split
by whole books.

    python tasks/bible_es_en/prepare.py                 # all books -> data/
    python tasks/bible_es_en/prepare.py --books Ruth,Jude --out /tmp/x
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SWORD_ROOT = Path("/usr/share/sword")
DEBIAN_PACKAGES = ("sword-text-sparv", "sword-text-kjv")
SPANISH_MODULE = "spaRV1909eb"
ENGLISH_MODULE = "engKJV2006eb"

TEST_BOOKS = (
    "Ruth", "Esther", "Ecclesiastes", "Jonah", "Micah", "Galatians", "Philippians",
    "Titus", "Philemon", "Jude", "I Peter", "James", "Hebrews",
)  # fmt: skip
DEV_BOOKS = (
    "Lamentations", "Joel", "Habakkuk", "Nahum", "Zephaniah", "Haggai", "Obadiah",
    "Song of Solomon", "Colossians", "I Thessalonians", "II Thessalonians",
    "II Timothy", "I John", "II John", "III John",
)  # fmt: skip

# A verse pair whose Strong's sets share less than this (Jaccard) is misaligned.
MIN_STRONGS_OVERLAP = 0.2

_STRONGS = re.compile(r'lemma="([^"]*)"')
_NOTE = re.compile(r"<note\b.*?</note>", re.S)
_NONCANON_TITLE = re.compile(r'<title\b(?![^>]*canonical="true").*?</title>', re.S)
_TAG = re.compile(r"<[^>]+>")
_SPACE = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?)\]])")
_SPACE_AFTER_OPENER = re.compile(r"([¡¿(\[])\s+")
_ALL_CAPS = re.compile(r"(^|[.:;!?¡¿]\s*|\s)([A-ZÁÉÍÓÚÑÜ])([A-ZÁÉÍÓÚÑÜ]+)\b")


@dataclass(frozen=True)
class Verse:
    ref: str
    book: str
    es: str
    en: str


def ensure_modules() -> None:
    """Installs the Debian Bible modules when they are missing (needs root and apt)."""
    missing = [m for m in (SPANISH_MODULE, ENGLISH_MODULE) if not _conf(m).exists()]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        sys.exit(
            f"error: SWORD modules {missing} missing and no apt-get; install {DEBIAN_PACKAGES}"
        )
    cmd = ["apt-get", "install", "-y", "-q", *DEBIAN_PACKAGES]
    if subprocess.run(cmd, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], check=False)
        if subprocess.run(cmd, check=False).returncode != 0:
            sys.exit(f"error: could not install {DEBIAN_PACKAGES}; run: sudo {' '.join(cmd)}")


def _conf(module: str) -> Path:
    return SWORD_ROOT / "mods.d" / f"{module}.conf"


def _open_bible(module: str):  # -> pysword SwordBible
    from pysword.bible import ZTextModule
    from pysword.modules import SwordModules

    # pysword decompresses a whole book for every verse; caching the blocks makes
    # extraction take seconds instead of minutes.
    if not hasattr(ZTextModule._decompressed_text, "cache_info"):
        ZTextModule._decompressed_text = functools.lru_cache(maxsize=None)(
            ZTextModule._decompressed_text
        )
    modules = SwordModules(str(SWORD_ROOT))
    modules.parse_modules()
    return modules.get_bible_from_module(module)


def strip_markup(raw: str) -> str:
    text = _NOTE.sub(" ", raw)
    text = _NONCANON_TITLE.sub(" ", text)
    text = _TAG.sub(" ", text).replace("¶", " ")
    text = _SPACE.sub(" ", text).strip()
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
    return _SPACE_AFTER_OPENER.sub(r"\1", text)


def decapitalise(text: str) -> str:
    """RV1909 capitalises chapter-initial words ("EN el principio", "Y ACONTECIÓ")."""

    def fix(m: re.Match[str]) -> str:
        lead, first, rest = m.groups()
        starts_sentence = not lead.isspace()
        return lead + (first if starts_sentence else first.lower()) + rest.lower()

    return _ALL_CAPS.sub(fix, text)


def strongs(raw: str) -> set[str]:
    return {n for group in _STRONGS.findall(raw) for n in group.split() if n.startswith("strong:")}


def overlap(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


def aligned(es: list[set[str]], en: list[set[str]], i: int) -> bool:
    """Verse i is aligned when its Strong's numbers match the same English verse well,
    and better than either neighbour (a shifted numbering matches a neighbour best)."""
    if not es[i] or not en[i]:
        return True
    own = overlap(es[i], en[i])
    neighbours = [overlap(es[i], en[j]) for j in (i - 1, i + 1) if 0 <= j < len(en)]
    return own >= MIN_STRONGS_OVERLAP and all(own >= n for n in neighbours)


def read_verses(books: list[str] | None, report: dict) -> Iterator[Verse]:
    es_bible, en_bible = _open_bible(SPANISH_MODULE), _open_bible(ENGLISH_MODULE)
    structure = en_bible.get_structure()
    for testament in structure.get_books().values():
        for book in testament:
            if books is not None and book.name not in books:
                continue
            for chapter in range(1, book.num_chapters + 1):
                n = book.chapter_lengths[chapter - 1]
                es_raw = [_raw(es_bible, book.name, chapter, v) for v in range(1, n + 1)]
                en_raw = [_raw(en_bible, book.name, chapter, v) for v in range(1, n + 1)]
                es_strongs, en_strongs = map(strongs, es_raw), map(strongs, en_raw)
                es_strongs, en_strongs = list(es_strongs), list(en_strongs)
                for i in range(n):
                    ref = f"{book.name} {chapter}:{i + 1}"
                    es, en = decapitalise(strip_markup(es_raw[i])), strip_markup(en_raw[i])
                    if not es or not en:
                        report["dropped_empty"].append(ref)
                    elif not aligned(es_strongs, en_strongs, i):
                        report["dropped_misaligned"].append(ref)
                    else:
                        yield Verse(ref, book.name, es, en)


def _raw(bible, book: str, chapter: int, verse: int) -> str:
    return bible.get(books=[book], chapters=[chapter], verses=[verse], clean=False)


def split_of(book: str) -> str:
    if book in TEST_BOOKS:
        return "test"
    if book in DEV_BOOKS:
        return "dev"
    return "train"


def write_splits(verses: list[Verse], out: Path) -> dict[str, int]:
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for name in ("train", "dev", "test"):
        rows = [v for v in verses if split_of(v.book) == name]
        counts[name] = len(rows)
        with open(out / f"{name}.tsv", "w", encoding="utf-8") as f:
            f.writelines(f"{v.ref}\t{v.es}\t{v.en}\n" for v in rows)
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "data")
    parser.add_argument("--books", help="comma-separated pysword book names (default: all)")
    args = parser.parse_args(argv)

    ensure_modules()
    books = args.books.split(",") if args.books else None
    report: dict = {"dropped_empty": [], "dropped_misaligned": []}
    verses = list(read_verses(books, report))
    counts = write_splits(verses, args.out)
    report["counts"] = counts
    (args.out / "prepare_report.json").write_text(json.dumps(report, indent=1) + "\n")
    dropped = len(report["dropped_empty"]) + len(report["dropped_misaligned"])
    print(f"kept {len(verses)} verse pairs {counts}, dropped {dropped} "
          f"({len(report['dropped_empty'])} empty, {len(report['dropped_misaligned'])} misaligned)")  # fmt: skip


if __name__ == "__main__":
    main()
