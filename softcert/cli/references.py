"""The report's bibliography as data: BibTeX entries, the keys each method cites, writers.

Kept as Python (not a .bib data file) so it ships with the package without package-data
configuration; ``write_bib`` writes ``references.bib`` beside ``report.tex``, which cites
it with ``\\cite{key}``, and ``markdown_list`` renders the same entries for report.md.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["ENTRIES", "METHOD_KEYS", "bibtex", "write_bib", "markdown_entry", "markdown_list", "cited"]

# key -> (entry type, fields); authors in BibTeX "Last, First and ..." form
ENTRIES: dict[str, tuple[str, dict]] = {
    "zhang2018crown": ("inproceedings", dict(
        author="Zhang, Huan and Weng, Tsui-Wei and Chen, Pin-Yu and Hsieh, Cho-Jui and Daniel, Luca",
        title="Efficient Neural Network Robustness Certification with General Activation Functions",
        booktitle="Advances in Neural Information Processing Systems (NeurIPS)", year="2018")),
    "xu2021fast": ("inproceedings", dict(
        author="Xu, Kaidi and Zhang, Huan and Wang, Shiqi and Wang, Yihan and Jana, Suman and Lin, Xue "
               "and Hsieh, Cho-Jui",
        title="Fast and Complete: Enabling Complete Neural Network Verification with Rapid and Massively "
              "Parallel Incomplete Verifiers",
        booktitle="International Conference on Learning Representations (ICLR)", year="2021")),
    "xu2020autolirpa": ("inproceedings", dict(
        author="Xu, Kaidi and Shi, Zhouxing and Zhang, Huan and Wang, Yihan and Chang, Kai-Wei and Huang, "
               "Minlie and Kailkhura, Bhavya and Lin, Xue and Hsieh, Cho-Jui",
        title="Automatic Perturbation Analysis for Scalable Certified Robustness and Beyond",
        booktitle="Advances in Neural Information Processing Systems (NeurIPS)", year="2020")),
    "shi2020transformers": ("inproceedings", dict(
        author="Shi, Zhouxing and Zhang, Huan and Chang, Kai-Wei and Huang, Minlie and Hsieh, Cho-Jui",
        title="Robustness Verification for Transformers",
        booktitle="International Conference on Learning Representations (ICLR)", year="2020")),
    "gowal2018ibp": ("misc", dict(
        author="Gowal, Sven and Dvijotham, Krishnamurthy and Stanforth, Robert and Bunel, Rudy and Qin, "
               "Chongli and Uesato, Jonathan and Arandjelovic, Relja and Mann, Timothy and Kohli, Pushmeet",
        title="On the Effectiveness of Interval Bound Propagation for Training Verifiably Robust Models",
        howpublished="arXiv:1810.12715", year="2018")),
    "davoodi2026vertex": ("misc", dict(
        author="Davoodi, Arash Gholami and Rezazadeh, Navid",
        title="Vertex-Softmax: Tight Transformer Verification via Exact Softmax Optimization",
        howpublished="arXiv:2605.10974", year="2026")),
    "shi2025genbab": ("inproceedings", dict(
        author="Shi, Zhouxing and Jin, Qirui and Kolter, Zico and Jana, Suman and Hsieh, Cho-Jui and Zhang, Huan",
        title="Neural Network Verification with Branch-and-Bound for General Nonlinearities",
        booktitle="Tools and Algorithms for the Construction and Analysis of Systems (TACAS)", year="2025")),
    "madry2018pgd": ("inproceedings", dict(
        author="Madry, Aleksander and Makelov, Aleksandar and Schmidt, Ludwig and Tsipras, Dimitris and "
               "Vladu, Adrian",
        title="Towards Deep Learning Models Resistant to Adversarial Attacks",
        booktitle="International Conference on Learning Representations (ICLR)", year="2018")),
    "blanchard2021softmax": ("article", dict(
        author="Blanchard, Pierre and Higham, Desmond J. and Higham, Nicholas J.",
        title="Accurately Computing the Log-Sum-Exp and Softmax Functions",
        journal="IMA Journal of Numerical Analysis", volume="41", number="4", pages="2311--2330", year="2021")),
    "milakov2018online": ("misc", dict(
        author="Milakov, Maxim and Gimelshein, Natalia",
        title="Online Normalizer Calculation for Softmax", howpublished="arXiv:1805.02867", year="2018")),
    "sao2026ghosts": ("misc", dict(
        author="Sao, Piyush",
        title="Ghosts of Softmax: Complex Singularities That Limit Safe Step Sizes in Cross-Entropy",
        howpublished="arXiv:2603.13552", year="2026")),
    "tzachristas2025topk": ("misc", dict(
        author="Tzachristas, Georgios and Deng, Lei and Tzachristas, Ioannis and Zhang, Gong and Chen, Renhai",
        title="A Mathematical Theory of Top-$k$ Sparse Attention via Total Variation Distance",
        howpublished="arXiv:2512.07647", year="2025")),
    "wang2020minilm": ("inproceedings", dict(
        author="Wang, Wenhui and Wei, Furu and Dong, Li and Bao, Hangbo and Yang, Nan and Zhou, Ming",
        title="MiniLM: Deep Self-Attention Distillation for Task-Agnostic Compression of Pre-Trained "
              "Transformers",
        booktitle="Advances in Neural Information Processing Systems (NeurIPS)", year="2020")),
    "clopper1934": ("article", dict(
        author="Clopper, C. J. and Pearson, E. S.",
        title="The Use of Confidence or Fiducial Limits Illustrated in the Case of the Binomial",
        journal="Biometrika", volume="26", number="4", pages="404--413", year="1934")),
}

# the references of each certify method (certify.METHODS names)
METHOD_KEYS = {
    "ibp": ("gowal2018ibp",),
    "crown": ("zhang2018crown", "shi2020transformers"),
    "alpha-crown": ("xu2021fast",),
    "alpha-crown-relu": ("xu2021fast",),
    "alpha-crown-intermediate": ("xu2021fast",),
    "vertex": ("davoodi2026vertex", "zhang2018crown"),
    "lirpa-ibp": ("xu2020autolirpa", "gowal2018ibp"),
    "lirpa-crown": ("xu2020autolirpa", "zhang2018crown"),
    "lirpa-alpha-crown": ("xu2020autolirpa", "xu2021fast"),
    "bab": ("shi2025genbab", "xu2021fast"),
    "bab-vertex": ("shi2025genbab", "davoodi2026vertex"),
}


def bibtex(keys=None) -> str:
    """The entries ``keys`` (default: all) as BibTeX text, in ``ENTRIES`` order."""
    if keys is not None:
        unknown = set(keys) - set(ENTRIES)
        if unknown:
            raise ValueError(f"keys: unknown references {sorted(unknown)}")
    keys = list(ENTRIES) if keys is None else [k for k in ENTRIES if k in set(keys)]
    out = []
    for key in keys:
        kind, fields = ENTRIES[key]
        # titles in double braces: BibTeX styles would lower-case "MiniLM", "Vertex-Softmax", ...
        body = ",\n".join(f"  {name} = {{{{{value}}}}}" if name == "title" else f"  {name} = {{{value}}}"
                           for name, value in fields.items())
        out.append(f"@{kind}{{{key},\n{body}\n}}")
    return "\n\n".join(out) + "\n"


def write_bib(path: Path | str, keys=None) -> Path:
    path = Path(path)
    path.write_text(bibtex(keys))
    return path


def markdown_entry(key: str) -> str:
    """One reference as Markdown: authors, title, venue, year."""
    kind, f = ENTRIES[key]
    names = [a.strip() for a in f["author"].split(" and ")]
    authors = ", ".join(" ".join(reversed([p.strip() for p in n.split(",", 1)])) for n in names)
    venue = f.get("booktitle") or f.get("journal") or f.get("howpublished", "")
    if f.get("volume"):
        venue += f" {f['volume']}({f.get('number', '')}):{f.get('pages', '').replace('--', '–')}"
    title = f["title"].replace("$k$", "k")
    return f"[{key}] {authors}. {title}. {venue}, {f['year']}."


def markdown_list(keys) -> list[str]:
    return [f"- {markdown_entry(k)}" for k in ENTRIES if k in set(keys)]


def cited(text: str) -> list[str]:
    """The keys cited by ``\\cite{a,b}`` commands in LaTeX ``text``, in order of first citation."""
    import re

    keys: list[str] = []
    for group in re.findall(r"\\cite\{([^}]*)\}", text):
        for k in group.split(","):
            k = k.strip()
            if k and k not in keys:
                keys.append(k)
    return keys
