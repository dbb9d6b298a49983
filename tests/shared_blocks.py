"""The blocks the scripts of algos/ share, kept byte-identical, and the copies of networks and
losses (COPIES: top-level definitions of the same name, checked without marker lines).

A block starts with a line `# ---- shared: <name> ----` and ends with
`# ---- end shared: <name> ----` (either may be indented, as inside `class Args`). A block named
`<family>/<name>` (e.g. `gae/compute_gae`) is a family block: every script of that family (FAMILIES
below) holds it. Every other block is held by every script. Each block is the same text in every
script that holds it.

    python tests/shared_blocks.py  # check: list every block that differs (a diff) or is missing
    python tests/shared_blocks.py --fix ppo.py  # copy its blocks into every script holding them
"""

import argparse
import ast
import difflib
import re
import sys
from pathlib import Path

ALGOS = Path(__file__).resolve().parents[1] / "algos"
# The families of scripts that share family blocks: a script of a family must hold every block of
# that family.
FAMILIES = {
    "ppo": {
        "gail.py",
        "ppo.py",
        "ppo_rnd.py",
        "ppo_lstm.py",
        "rl2.py",
        "ppo_continuous.py",
        "ppo_atari.py",
        "ppo_atari_envpool.py",
        "ppo_atari_multigpu.py",
        "mappo_smac_lite.py",
        "ippo_smac_lite.py",
        "mappo_mpe.py",
        "ippo_mpe.py",
    },
    "gae": {
        "gail.py",
        "a2c.py",
        "ppo_rnd.py",
        "ppo.py",
        "ppo_lstm.py",
        "rl2.py",
        "ppo_continuous.py",
        "ppo_atari.py",
        "ppo_atari_envpool.py",
        "ppo_atari_multigpu.py",
        "mappo_smac_lite.py",
        "ippo_smac_lite.py",
        "mappo_mpe.py",
        "ippo_mpe.py",
    },
    "atari": {
        "dqn_atari.py",
        "ddqn_atari.py",
        "c51_atari.py",
        "iqn_atari.py",
        "sac_atari.py",
        "rainbow_atari.py",
    },
    "classic": {"dqn.py", "c51.py", "qrdqn.py"},
    "continuous": {"ddpg_continuous.py", "sac_continuous.py", "td3_continuous.py"},
    "mpe": {"mappo_mpe.py", "ippo_mpe.py", "maddpg_mpe.py"},
    "qmix": {"qmix_smac_lite.py", "vdn_smac_lite.py"},
    "lm": {"grpo_lm.py", "dpo_lm.py", "ppo_lm.py"},
    "offline": {
        "bc_continuous.py",
        "td3_bc_continuous.py",
        "iql_continuous.py",
        "cql_continuous.py",
        "bc_discrete.py",
        "cql_discrete.py",
    },
    "offline_continuous": {
        "bc_continuous.py",
        "td3_bc_continuous.py",
        "iql_continuous.py",
        "cql_continuous.py",
    },
    "offline_discrete": {"bc_discrete.py", "cql_discrete.py"},
    # the on-policy scripts on gymnasium vector envs (ppo_atari_envpool.py's envpool differs)
    "bootstrap": {
        "gail.py",
        "a2c.py",
        "pqn.py",
        "impala.py",
        "ppo.py",
        "ppo_atari.py",
        "ppo_atari_multigpu.py",
        "ppo_continuous.py",
        "ppo_rnd.py",
    },
    # the scripts that scale rewards by the dataset's spread of episode returns
    "offline_reward": {"iql_continuous.py", "cql_continuous.py"},
}
# Copies checked without marker lines: a top-level class or function of this name is the same text
# in every script of its group (an algorithm's network or loss a reader meets whole, not plumbing).
# Where the scripts differ on purpose, the script says why next to the definition.
COPIES = {
    "RunningMeanStd": {"ppo_lstm.py", "ppo_continuous.py", "rl2.py", "ppo_rnd.py", "gail.py"},
    "layer_init": {
        "gail.py",
        "a2c.py",
        "ppo_rnd.py",
        "pqn.py",
        "impala.py",
        "ppo.py",
        "ppo_continuous.py",
        "ppo_atari.py",
        "ppo_atari_envpool.py",
        "ppo_atari_multigpu.py",
        "mappo_smac_lite.py",
        "ippo_smac_lite.py",
        "mappo_mpe.py",
        "ippo_mpe.py",
    },
    "soft_update": {
        "c51.py",
        "c51_atari.py",
        "cql_continuous.py",
        "cql_discrete.py",
        "ddpg_continuous.py",
        "ddqn_atari.py",
        "dqn.py",
        "dqn_atari.py",
        "iql_continuous.py",
        "iqn_atari.py",
        "maddpg_mpe.py",
        "qmix_smac_lite.py",
        "qrdqn.py",
        "rainbow_atari.py",
        "sac_atari.py",
        "sac_continuous.py",
        "td3_bc_continuous.py",
        "td3_continuous.py",
        "vdn_smac_lite.py",
    },
    "linear_schedule": {
        "dqn.py",
        "pqn.py",
        "c51.py",
        "qrdqn.py",
        "dqn_atari.py",
        "ddqn_atari.py",
        "c51_atari.py",
        "iqn_atari.py",
        "qmix_smac_lite.py",
        "vdn_smac_lite.py",
    },
    "Agent": [
        {"a2c.py", "ppo.py"},
        {"ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_multigpu.py"},
    ],
    "evaluate": [
        {"a2c.py", "ppo.py"},
        {"ppo_atari.py", "ppo_atari_multigpu.py"},
        {"mappo_smac_lite.py", "ippo_smac_lite.py"},
        {"mappo_mpe.py", "ippo_mpe.py"},
        {"c51.py", "dqn.py", "pqn.py"},
    ],
    # ppo_lstm.py's differs on purpose: it also clips continuous actions to their bounds
    "make_env": [
        {"a2c.py", "c51.py", "dqn.py", "gail.py", "ppo.py", "qrdqn.py"},
        {"ppo_atari.py", "ppo_atari_multigpu.py"},
        {"impala.py", "pqn.py"},
    ],
    "minibatch_loss": {"ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_multigpu.py"},
    "Actor": [
        {"bc_continuous.py", "td3_bc_continuous.py"},
        {"ddpg_continuous.py", "td3_continuous.py"},
    ],
    "QNetwork": [
        {"iql_continuous.py", "td3_bc_continuous.py"},
        {"dqn_atari.py", "ddqn_atari.py"},
    ],
    "td_target": {"dqn.py", "dqn_atari.py"},
    "categorical_loss": {"c51.py", "c51_atari.py"},
    "categorical_projection": {"c51.py", "c51_atari.py", "rainbow_atari.py"},
    "greedy_pmfs": {"c51.py", "c51_atari.py"},
    "ValueNorm": {"mappo_smac_lite.py", "ippo_smac_lite.py", "mappo_mpe.py", "ippo_mpe.py"},
    "actor_inputs": {"mappo_smac_lite.py", "ippo_smac_lite.py", "mappo_mpe.py", "ippo_mpe.py"},
    "critic_inputs": {"ippo_smac_lite.py", "ippo_mpe.py"},
    # the agent script copies the single-turn family's rewards, policy, advantages and loss
    "final_answer": {"grpo_lm.py", "grpo_agent_lm.py"},
    "same_answer": {"grpo_lm.py", "grpo_agent_lm.py"},
    "reward_exact": {"grpo_lm.py", "grpo_agent_lm.py"},
    "reward_final_answer": {"grpo_lm.py", "grpo_agent_lm.py"},
    "reward_format": {"grpo_lm.py", "grpo_agent_lm.py"},
    "reward_reasoning_gym": {"grpo_lm.py", "grpo_agent_lm.py"},
    "problem_targets": {"grpo_lm.py", "grpo_agent_lm.py"},
    "score": {"grpo_lm.py", "grpo_agent_lm.py"},
    "Policy": {"grpo_lm.py", "grpo_agent_lm.py"},
    "encode_prompts": {"grpo_lm.py", "grpo_agent_lm.py"},
    "load_policy": {"grpo_lm.py", "grpo_agent_lm.py"},
    "add_lora": {"grpo_lm.py", "grpo_agent_lm.py"},
    "reference_logprobs": {"grpo_lm.py", "grpo_agent_lm.py"},
    "group_advantages": {"grpo_lm.py", "grpo_agent_lm.py"},
    "k3_kl": {"grpo_lm.py", "grpo_agent_lm.py"},
    "clipped_loss": {"grpo_lm.py", "grpo_agent_lm.py"},
}
BLOCK = re.compile(
    r"^([ \t]*)# ---- shared: (\S+) ----\n(.*?)^\1# ---- end shared: \2 ----\n", re.M | re.S
)


def blocks(text: str) -> dict[str, str]:
    """{name: the block's text between its markers} of one script."""
    found = {}
    for m in BLOCK.finditer(text):
        if m.group(2) in found:
            raise ValueError(f"block {m.group(2)!r} appears twice")
        found[m.group(2)] = m.group(3)
    return found


def scripts(algos: Path = ALGOS) -> list[Path]:
    return sorted(algos.glob("*.py"))


def differences(paths: list[Path]) -> list[str]:
    """One problem per entry: a block missing from a script that must hold it, or a block with more
    than one text (the scripts of each text are listed, separated by |, followed by a unified diff
    of the first two texts)."""
    texts = {p: blocks(p.read_text()) for p in paths}
    names = sorted({n for t in texts.values() for n in t} | {f"{f}/" for f in FAMILIES})
    problems = []
    for name in names:
        family = name.split("/")[0] if "/" in name else None
        if name.endswith("/"):  # a family's members must hold at least one block of it
            problems += [
                f"{p.name}: holds no block of family {family!r}"
                for p in paths
                if p.name in FAMILIES[family] and not any(n.startswith(name) for n in texts[p])
            ]
            continue
        if family is not None and family not in FAMILIES:
            problems.append(
                f"block {name!r}: no family {family!r} in FAMILIES of tests/shared_blocks.py"
            )
            continue
        holders = [p for p in paths if name in texts[p]]
        members = [p for p in paths if family is None or p.name in FAMILIES[family]]
        problems += [f"{p.name}: lacks shared block {name!r}" for p in members if p not in holders]
        problems += [
            f"{p.name}: holds block {name!r} of a family it is not in"
            for p in holders
            if p not in members
        ]
        versions = sorted(
            {texts[p][name] for p in holders},
            key=lambda t: -sum(texts[p][name] == t for p in holders),
        )
        if len(versions) > 1:  # name the scripts of each version, the most common version first
            groups = [", ".join(p.name for p in holders if texts[p][name] == v) for v in versions]
            a, b = (next(p.name for p in holders if texts[p][name] == v) for v in versions[:2])
            diff = difflib.unified_diff(
                versions[0].splitlines(), versions[1].splitlines(), a, b, lineterm="", n=1
            )
            problems.append(
                f"shared block {name!r} differs: " + " | ".join(groups) + "\n" + "\n".join(diff)
            )
    return problems


def definitions(text: str) -> dict[str, str]:
    """{name: source text} of a script's top-level classes and functions."""
    tree = ast.parse(text)
    return {
        node.name: ast.get_source_segment(text, node)
        for node in tree.body
        if isinstance(node, (ast.ClassDef, ast.FunctionDef))
    }


def copy_differences(paths: list[Path]) -> list[str]:
    """One problem per group of COPIES whose scripts do not hold the same definition (with a
    unified diff of the first two texts), or where a script lacks it."""
    texts = {p.name: definitions(p.read_text()) for p in paths}
    problems = []
    for name, groups in COPIES.items():
        for group in groups if isinstance(groups, list) else [groups]:
            present = sorted(s for s in group if s in texts)
            lacking = [s for s in present if name not in texts[s]]
            problems += [f"{s}: lacks {name!r}, a checked copy (COPIES)" for s in lacking]
            holders = [s for s in present if s not in lacking]
            versions = sorted(
                {texts[s][name] for s in holders},
                key=lambda v: -sum(texts[s][name] == v for s in holders),
            )  # the most common text first
            if len(versions) > 1:
                a, b = (next(s for s in holders if texts[s][name] == v) for v in versions[:2])
                diff = difflib.unified_diff(
                    versions[0].splitlines(), versions[1].splitlines(), a, b, lineterm="", n=1
                )
                groups_text = " | ".join(
                    ", ".join(s for s in holders if texts[s][name] == v) for v in versions
                )
                problems.append(f"copy {name!r} differs: {groups_text}\n" + "\n".join(diff))
    return problems


def fix(source: Path, paths: list[Path]) -> list[Path]:
    """Copy the blocks of `source` into every other path that has the markers; returns the files
    changed. A block a script lacks altogether is not added (where it goes is the script author's
    choice): differences() reports it."""
    wanted, changed = blocks(source.read_text()), []

    # the block rebuilt around the source's text (a block the source lacks stays as it is)
    def copy(m):
        indent, name, body = m.group(1), m.group(2), m.group(3)
        return (
            f"{indent}# ---- shared: {name} ----\n{wanted.get(name, body)}{indent}# "
            f"---- end shared: {name} ----\n"
        )

    for p in paths:
        if p.resolve() == source.resolve():
            continue
        text = p.read_text()
        new = BLOCK.sub(copy, text)
        if new != text:
            p.write_text(new)
            changed.append(p)
    return changed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--fix",
        type=Path,
        metavar="SCRIPT",
        help="copy this script's shared blocks into the others",
    )
    p.add_argument("--algos", type=Path, default=ALGOS, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    paths = scripts(a.algos)
    if a.fix:
        if not a.fix.is_file() and (a.algos / a.fix).is_file():  # a bare script name: ppo.py
            a.fix = a.algos / a.fix
        if not a.fix.is_file():
            p.error(f"no script {a.fix}")
        for changed in fix(a.fix, paths):
            print(f"updated {changed}")
    problems = differences(paths) + copy_differences(paths)
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
