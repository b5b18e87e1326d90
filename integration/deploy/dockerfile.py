"""Read the repository's Dockerfile and .dockerignore as Docker would, without Docker.

Just enough of the Dockerfile syntax for this project's file: line continuations, comments,
global ARGs, stages (``FROM image AS name``), and the instructions the tests look at (ENV, ARG,
COPY, USER, EXPOSE, LABEL, HEALTHCHECK, ENTRYPOINT, CMD) in their JSON ("exec") and shell forms.
The tests use it to check the image's contract (tests/test_dockerfile.py) and to run the image's
exact command line and environment against a local broker
(integration/deploy/test_image_entrypoint.py).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from docker.utils.build import exclude_paths

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

_VARIABLE = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True, slots=True)
class Instruction:
    keyword: str  # upper case: ENV, COPY, ...
    arguments: str  # the rest of the (joined) line

    def exec_form(self) -> list[str]:
        """ENTRYPOINT/CMD/RUN in JSON form as a list; the shell form as ["/bin/sh", "-c", text]."""
        text = self.arguments.strip()
        if text.startswith("["):
            value = json.loads(text)
            assert isinstance(value, list) and all(isinstance(item, str) for item in value), text
            return value
        return ["/bin/sh", "-c", text]

    def pairs(self) -> list[tuple[str, str]]:
        """ENV/LABEL/ARG ``key=value ...`` (quotes removed), or the legacy ``ENV key value``."""
        words = shlex.split(self.arguments, posix=True)
        if self.keyword == "ENV" and words and "=" not in words[0]:
            return [(words[0], " ".join(words[1:]))]
        result = []
        for word in words:
            key, sep, value = word.partition("=")
            result.append((key, value if sep else ""))
        return result

    def flags_and_words(self) -> tuple[dict[str, str], list[str]]:
        """``--from=build src dest`` -> ({"from": "build"}, ["src", "dest"])."""
        flags: dict[str, str] = {}
        words: list[str] = []
        for word in shlex.split(self.arguments, posix=True):
            if word.startswith("--") and not words:
                key, _, value = word[2:].partition("=")
                flags[key] = value
            else:
                words.append(word)
        return flags, words


@dataclass
class Stage:
    base: str  # as written, ARGs not substituted
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def env(self, inherited: Mapping[str, str]) -> dict[str, str]:
        """The variables ENV sets, ``$VAR``/``${VAR}`` expanded from `inherited` (the base image's
        environment) and earlier ENVs, as Docker expands them."""
        seen = dict(inherited)
        result: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for key, value in instruction.pairs():
                expanded = _VARIABLE.sub(lambda m: seen.get(m["braced"] or m["bare"], ""), value)
                seen[key] = result[key] = expanded
        return result

    def copies(self) -> list[tuple[dict[str, str], list[str], str]]:
        """Each COPY as (flags, sources, destination)."""
        result = []
        for instruction in self.all("COPY"):
            flags, words = instruction.flags_and_words()
            result.append((flags, words[:-1], words[-1]))
        return result


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        return next(stage for stage in self.stages if stage.name == name)

    def resolve(self, text: str) -> str:
        """Substitute the global ARGs' defaults (as in a FROM line)."""
        return _VARIABLE.sub(lambda m: self.global_args.get(m["braced"] or m["bare"], m[0]), text)


def logical_lines(text: str) -> list[str]:
    """Lines with continuations joined and comment lines dropped (inside continuations too)."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#"):
            continue
        if not stripped and not current:
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1].rstrip() + " "
            continue
        current += stripped
        if current.strip():
            lines.append(current.strip())
        current = ""
    if current.strip():
        lines.append(current.strip())
    return lines


def parse_dockerfile(text: str) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical_lines(text):
        keyword, _, arguments = line.partition(" ")
        instruction = Instruction(keyword.upper(), arguments.strip())
        if instruction.keyword == "FROM":
            flags, words = instruction.flags_and_words()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif not stages:
            assert instruction.keyword == "ARG", f"only ARG may precede FROM: {line}"
            global_args.update(instruction.pairs())
        else:
            stages[-1].instructions.append(instruction)
    return Dockerfile(global_args, stages)


def read_dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    return parse_dockerfile(path.read_text())


def dockerignore_patterns(path: Path = DOCKERIGNORE) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#")]


def build_context_files(root: Path = ROOT) -> list[str]:
    """Files (relative paths) Docker sends as the build context: what .dockerignore lets through."""
    patterns = dockerignore_patterns(root / ".dockerignore")
    return sorted(path for path in exclude_paths(str(root), patterns, dockerfile="Dockerfile")
                  if (root / path).is_file() and not (root / path).is_symlink())


def copy_build_context(destination: Path, root: Path = ROOT) -> list[str]:
    """Copy the build context into `destination` (as `docker build` would see it); its file list."""
    files = build_context_files(root)
    for relative in files:
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / relative, target)
    return files
