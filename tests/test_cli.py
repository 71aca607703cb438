"""The headless CLI: real subprocesses, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def chatui(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chatui", *args], capture_output=True,
                          text=True, timeout=timeout, env=ENV)


def test_version_and_help():
    r = chatui("--version")
    assert r.returncode == 0 and r.stdout.startswith("chatui ")
    for cmd in ("generate", "batch", "compare", "bench", "export"):
        h = chatui(cmd, "--help")
        assert h.returncode == 0 and "--ckpt" in h.stdout or cmd == "export", cmd


@pytest.mark.parametrize("args, words", [
    (["generate", "-p", "hi", "--ckpt", "/no/such/dir"], "No such file or directory"),
    (["generate", "-p", "hi", "--top-p", "2"], "top_p must be in (0, 1]"),
    (["generate", "-p", "hi", "--temperature", "-1"], "temperature must be between 0 and 100"),
    (["generate"], "give a prompt"),
    (["generate", "--prompt-file", "/no/such/file"], "cannot read the prompt file"),
    (["generate", "-p", "hi", "--top-logprobs", "50"], "--top-logprobs must be between 0 and 20"),
    (["generate", "-p", "hi", "--backend", "nope"], "unknown backend"),
    (["generate", "-p", "hi", "--backend", "openai"], "needs --base-url"),
    (["compare", "-p", "hi"], "between 1 and 6 --setting"),
    (["compare", "-p", "hi", "--setting", "warmth=2"], "unknown setting 'warmth'"),
    (["batch", "--input-file", "/no/such/file"], "cannot read"),
    (["export", "/no/such/transcript.json"], "/no/such/transcript.json"),
    (["--compile", "always"], "unknown compile mode 'always'"),
    (["bench", "--compile", "always"], "unknown compile mode 'always'"),
])
def test_bad_input_gives_one_sentence_and_exit_2(args, words):
    r = chatui(*args)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_checkpoint_dir_is_reported(tmp_path: Path):
    (tmp_path / "config.json").write_text("{not json")
    r = chatui("generate", "-p", "hi", "--ckpt", str(tmp_path))
    assert r.returncode == 2 and "not valid JSON" in r.stderr and "Traceback" not in r.stderr


def test_generate_json_on_tiny_model(tiny_model_dir: Path):
    r = chatui("generate", "-p", "Hello", "--ckpt", str(tiny_model_dir), "--temperature", "0",
               "--max-tokens", "6", "--json", "--top-logprobs", "3")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    toks, done = lines[:-1], lines[-1]
    assert len(toks) == 6 and all(t["type"] == "token" for t in toks)
    assert set(toks[0]) >= {"id", "text", "logprob", "entropy", "top"}
    assert len(toks[0]["top"]) == 3 and set(toks[0]["top"][0]) == {
        "id", "text", "logprob", "sampled_prob", "cut"}
    # greedy: what the sampler did is certain, the one token in its nucleus
    assert all(t["sampled_prob"] == 1.0 and t["nucleus"] == 1 for t in toks)
    assert [a["cut"] for a in toks[0]["top"]] == [None, "greedy", "greedy"]
    assert done["type"] == "done" and done["finish_reason"] == "length"
    assert done["completion_tokens"] == 6 and done["prompt_tokens"] > 0
    assert {"ttft_s", "decode_tokens_per_s"} <= set(done)


def test_generate_says_in_words_how_a_reply_ended(tiny_model_dir: Path):
    """The plain output's last line said "[length]" (the finish reason itself) both where the
    token limit cut a reply off and where the context did."""
    r = chatui("generate", "--ckpt", str(tiny_model_dir), "-p", "Hello", "--temperature", "0",
               "--max-tokens", "4")
    assert r.returncode == 0, r.stderr
    assert "[cut off at the token limit]" in r.stderr and "[length]" not in r.stderr


def test_batch_keeps_input_order_and_matches_generate(tiny_model_dir: Path, tmp_path: Path):
    prompts = ["Hello", "What is two plus two?", "Name a colour"]
    (tmp_path / "p.txt").write_text("\n".join(prompts) + "\n\n")
    out = tmp_path / "out.jsonl"
    r = chatui("batch", "--input-file", str(tmp_path / "p.txt"), "--output", str(out),
               "--ckpt", str(tiny_model_dir), "--temperature", "0", "--max-tokens", "8")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["prompt"] for x in rows] == prompts and [x["index"] for x in rows] == [0, 1, 2]
    single = chatui("generate", "-p", prompts[1], "--ckpt", str(tiny_model_dir),
                    "--temperature", "0", "--max-tokens", "8", "--json")
    events = [json.loads(x) for x in single.stdout.splitlines()]
    assert "".join(e["text"] for e in events if e["type"] == "token") == rows[1]["text"]


def test_batch_answers_a_file_in_groups_the_same(tiny_model_dir: Path, tmp_path: Path):
    """`--batch 2` answers five lines two at a time (a whole file was one batch, its KV cache
    as large as the file), in input order, each line as the one batch of all five answers it
    (every row is its prompt alone, to the bit); `--batch 0` is refused in one sentence."""
    prompts = ["Hello", "What is two plus two?", "", "Name a colour", "Count to three", "Hi"]
    (tmp_path / "p.txt").write_text("\n".join(prompts) + "\n")
    got = {}
    for rows in ("2", "8"):
        out = tmp_path / f"out{rows}.jsonl"
        r = chatui("batch", "--input-file", str(tmp_path / "p.txt"), "--output", str(out),
                   "--batch", rows, "--ckpt", str(tiny_model_dir), "--temperature", "0",
                   "--max-tokens", "6")
        assert r.returncode == 0, r.stderr
        got[rows] = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["index"] for x in got["2"]] == [0, 1, 3, 4, 5]
    assert [x["text"] for x in got["2"]] == [x["text"] for x in got["8"]]
    r = chatui("batch", "--input-file", str(tmp_path / "p.txt"), "--batch", "0",
               "--ckpt", str(tiny_model_dir))
    assert r.returncode == 2 and "--batch takes 1 to 256" in r.stderr


def test_a_batch_group_written_stays_when_a_later_one_fails(tmp_path: Path):
    """`chatui batch` writes each group's lines as the group ends: a failure after the first
    group (the worker gone, say) leaves them in the file, whole lines."""
    from chatui.cli.commands import _json_lines_sink

    out = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError):
        with _json_lines_sink(out) as sink:
            sink(['{"index": 0}', '{"index": 1}'])
            assert out.read_text() == '{"index": 0}\n{"index": 1}\n'  # (flushed already)
            raise RuntimeError("the worker died")
    assert out.read_text() == '{"index": 0}\n{"index": 1}\n'


def test_a_batch_line_too_long_fails_alone(tiny_model_dir: Path, tmp_path: Path):
    """One line too long for the context: its record says why (``"error"``, finish reason
    "error"), the other lines are answered and written, stderr names the line and the exit
    status is 1 (the whole file failed with status 2 and nothing written)."""
    (tmp_path / "p.txt").write_text("Hello\n" + "word " * 20000 + "\nName a colour\n")
    out = tmp_path / "out.jsonl"
    r = chatui("batch", "--input-file", str(tmp_path / "p.txt"), "--output", str(out),
               "--ckpt", str(tiny_model_dir), "--temperature", "0", "--max-tokens", "4")
    assert r.returncode == 1, r.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["finish_reason"] == "error" for x in rows] == [False, True, False]
    assert "too long" in rows[1]["error"] and rows[1]["text"] == ""
    assert rows[0]["text"] and rows[2]["text"] and "error" not in rows[0]
    assert "line 2: " in r.stderr and "1 line failed" in r.stderr


def test_compare_json_tags_columns(tiny_model_dir: Path):
    r = chatui("compare", "-p", "Hello", "--ckpt", str(tiny_model_dir), "--max-tokens", "5",
               "--setting", "temperature=0", "--setting", "temperature=1.0,top_p=0.9,seed=3",
               "--json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert {x["column"] for x in lines} == {0, 1} and not any("row" in x for x in lines)
    assert sum(1 for x in lines if x["type"] == "done") == 2


def test_bench_json_on_tiny_model(tiny_model_dir: Path):
    r = chatui("bench", "--ckpt", str(tiny_model_dir), "--prompt-tokens", "32",
               "--new-tokens", "8", "--vs-hf", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["new_tokens"] == 8 and d["decode_tokens_per_s"] > 0
    assert d["hf_decode_tokens_per_s"] > 0 and d["speedup_vs_hf"] > 0
    assert d["weight_bytes"] > 0 and d["peak_memory_mb"] > 0
