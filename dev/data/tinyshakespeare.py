"""
Tiny Shakespeare tokenized with the GPT-2 BPE (needs internet and tiktoken).

Steps:
  1. download input.txt (~1 MB) into data/tinyshakespeare/ (skipped if the
     file is already there),
  2. load the GPT-2 encoding with tiktoken (tiktoken itself downloads its BPE
     files on first use and caches them),
  3. split the text into documents on blank lines ("\\n\\n"), putting the GPT-2
     end-of-text token (50256) before each document,
  4. write, like llm.c's dev/data/tinyshakespeare.py:
        val_000000.bin    the first 32,768 tokens
        train_000000.bin  all the remaining tokens
        tokenizer.bin     the GPT-2 tokenizer (50257 tokens, eot 50256)

This script needs a network; the fully offline default dataset of this
project is `python3 dev/data/arithmetic.py`. It never hangs: every network
step has a timeout, and any failure is reported as a single line on stderr
with exit code 1.

Usage (from the repository root):
    pip install tiktoken
    python3 dev/data/tinyshakespeare.py
"""

import argparse
import os
import socket
import sys
import threading
import urllib.error
import urllib.request

from data_common import write_shard, write_tokenizer

DATA_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/"
            "data/tinyshakespeare/input.txt")
# where tiktoken fetches the GPT-2 BPE files from (named in error messages)
BPE_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"

GPT2_EOT = 50256
GPT2_VOCAB_SIZE = 50257
VAL_TOKENS = 32768          # the first 32,768 tokens are the validation split

SOCKET_TIMEOUT_S = 15       # per connect/read on a socket
# whole-step wall-clock limits, a backstop: socket timeouts do not cover DNS
# lookups or slow-but-alive transfers, so each network step also runs in a
# worker thread that we stop waiting for after this long
DOWNLOAD_LIMIT_S = 60
TIKTOKEN_LIMIT_S = 60

OFFLINE_HINT = "the offline default dataset is: python3 dev/data/arithmetic.py"


class Failure(Exception):
    """A failure to report as one line on stderr (then exit code 1)."""


def one_line(e):
    """Describe an exception on a single line."""
    msg = " ".join(str(e).split()) or "no details"
    return f"{type(e).__name__}: {msg}"


def run_with_limit(fn, limit_s, what):
    """Run fn() in a daemon thread; return its result or raise Failure.

    If fn() has not finished after limit_s seconds we give up on it; as the
    thread is a daemon it cannot keep the process alive at exit.
    """
    result = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as e:  # hand any error back to the main thread
            result["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(limit_s)
    if t.is_alive():
        raise Failure(f"timed out after {limit_s} s while {what}")
    if "error" in result:
        raise result["error"]
    return result["value"]


# ----------------------------------------------------------------------------
# the steps

def import_tiktoken():
    try:
        import tiktoken
    except ImportError:
        raise Failure("the tiktoken package is not installed; run "
                      f"`pip install tiktoken` ({OFFLINE_HINT})")
    return tiktoken


def download(url, path):
    """Download url to path (atomically) unless path already exists."""
    if os.path.exists(path):
        print(f"{path}: already present, skipping download")
        return

    def fetch():
        with urllib.request.urlopen(url, timeout=SOCKET_TIMEOUT_S) as resp:
            return resp.read()

    try:
        data = run_with_limit(fetch, DOWNLOAD_LIMIT_S, f"downloading {url}")
    except Failure as e:
        raise Failure(f"could not download {url}: {e} "
                      f"(no internet? {OFFLINE_HINT})")
    except (urllib.error.URLError, OSError, ValueError) as e:
        # URLError covers DNS failures and refused connections, OSError
        # covers socket timeouts, HTTPError is a URLError
        raise Failure(f"could not download {url}: {one_line(e)} "
                      f"(no internet? {OFFLINE_HINT})")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    print(f"{path}: downloaded {len(data):,} bytes from {url}")


def give_requests_a_timeout():
    """Make requests.get() default to our socket timeout.

    tiktoken downloads its BPE files with requests.get(url) and no timeout,
    and requests ignores socket.setdefaulttimeout(), so a silent server
    would block it forever. We wrap requests.get so calls that do not pass
    a timeout get SOCKET_TIMEOUT_S. (run_with_limit stays as a backstop.)
    """
    try:
        import requests
    except ImportError:  # tiktoken would then fail with its own message
        return
    if getattr(requests.get, "_default_timeout_wrapped", False):
        return
    original_get = requests.get

    def get_with_timeout(url, *args, **kwargs):
        kwargs.setdefault("timeout", SOCKET_TIMEOUT_S)
        return original_get(url, *args, **kwargs)

    get_with_timeout._default_timeout_wrapped = True
    requests.get = get_with_timeout


def load_gpt2_encoding(tiktoken):
    """tiktoken.get_encoding('gpt2'), with time limits on its fetch."""
    give_requests_a_timeout()
    try:
        return run_with_limit(lambda: tiktoken.get_encoding("gpt2"),
                              TIKTOKEN_LIMIT_S,
                              "tiktoken fetched the GPT-2 BPE files")
    except Exception as e:  # requests errors, timeouts, hash mismatches...
        detail = str(e) if isinstance(e, Failure) else one_line(e)
        raise Failure("tiktoken could not load the GPT-2 encoding, which it "
                      f"downloads from {BPE_URL} (vocab.bpe, encoder.json): "
                      f"{detail} (no internet? {OFFLINE_HINT})")


def tokenize(enc, text):
    """Split into documents on blank lines, each preceded by EOT.

    The "\\n\\n" separators are kept at the end of each document (except the
    last), as in llm.c, so decoding the stream reproduces the text.
    """
    sections = text.split("\n\n")
    tokens = []
    for i, section in enumerate(sections):
        tokens.append(GPT2_EOT)
        if i != len(sections) - 1:
            section += "\n\n"
        tokens.extend(enc.encode_ordinary(section))
    return tokens, len(sections)


def write_gpt2_tokenizer(enc, path):
    if enc.n_vocab != GPT2_VOCAB_SIZE:
        raise Failure(f"unexpected GPT-2 vocab size {enc.n_vocab}")
    token_bytes = [enc.decode_single_token_bytes(i)
                   for i in range(GPT2_VOCAB_SIZE)]
    write_tokenizer(path, token_bytes, GPT2_EOT)
    print(f"{path}: vocab {GPT2_VOCAB_SIZE}, eot {GPT2_EOT} (GPT-2 BPE)")


# ----------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(
        description="Download and tokenize tinyshakespeare (GPT-2 BPE).")
    p.add_argument("--out-dir", default=os.path.join("data", "tinyshakespeare"),
                   help="output directory (default data/tinyshakespeare)")
    args = p.parse_args(argv)

    # a default timeout for every socket this process opens (tiktoken's
    # HTTP library included, where it honours it)
    socket.setdefaulttimeout(SOCKET_TIMEOUT_S)
    try:
        tiktoken = import_tiktoken()
        os.makedirs(args.out_dir, exist_ok=True)
        text_path = os.path.join(args.out_dir, "input.txt")
        download(DATA_URL, text_path)
        enc = load_gpt2_encoding(tiktoken)

        with open(text_path, "r", encoding="utf-8") as f:
            text = f.read()
        tokens, num_docs = tokenize(enc, text)
        if len(tokens) <= VAL_TOKENS:
            raise Failure(f"{text_path} is too short ({len(tokens)} tokens); "
                          "delete it and run again to re-download")
        val, train = tokens[:VAL_TOKENS], tokens[VAL_TOKENS:]
        # documents are counted by their leading EOT tokens
        for name, part in (("val", val), ("train", train)):
            path = os.path.join(args.out_dir, f"{name}_000000.bin")
            write_shard(path, part)
            print(f"{path}: {len(part):,} tokens, "
                  f"{part.count(GPT2_EOT):,} documents "
                  f"(of {num_docs:,} in the text)")
        write_gpt2_tokenizer(enc, os.path.join(args.out_dir, "tokenizer.bin"))
    except Failure as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 1
    except Exception as e:  # anything unexpected is still one line
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
