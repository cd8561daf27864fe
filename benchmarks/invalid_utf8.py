"""Where an answer's broken characters come from: the model's own bytes, or the stream.

    python -m benchmarks.invalid_utf8 [--model smollm2-135m] [--rounds 6] [--json PATH]

A byte-level model writes a Chinese character as two to four byte tokens, and may sample a
UTF-8 lead byte and then a token that does not continue it: that is invalid UTF-8, which
every decoder shows as U+FFFD ("概\ufffda"). The stream (engine/detokenizer.py) holds back a
character while its bytes are still arriving, so it could only add a U+FFFD of its own by
splitting one. This run asks the model eight Chinese questions `--rounds` times at temperature
1.0 (its chat template, each request its own seed) and counts, per answer, the U+FFFD in the
text the engine streamed and in the whole output decoded at once: equal counts everywhere mean
every broken character is the model's own.
"""

from __future__ import annotations

import argparse

from benchmarks.common import write_json

QUESTIONS = ("用一句话解释什么是 KV 缓存。", "请介绍一下北京。", "什么是连续批处理？",
             "为什么要分页管理显存？", "写一首关于大海的短诗。", "推测解码是什么意思？",
             "你好，请自我介绍。", "什么是首字延迟？")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.invalid_utf8", description=__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from engine import EngineConfig, LLMEngine, SamplingParams

    eng = LLMEngine(EngineConfig(model=args.model, max_model_len=512,
                                 max_num_seqs=len(QUESTIONS)))
    tok = eng.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                       add_generation_prompt=True) for q in QUESTIONS]
    answers = broken = agree = 0
    examples = []
    for r in range(args.rounds):
        params = [SamplingParams(max_tokens=args.max_tokens, temperature=1.0,
                                 seed=1000 * r + i) for i in range(len(prompts))]
        for out in eng.generate(prompts, params):
            answers += 1
            # the whole output decoded at once, without a character cut at max_tokens
            whole = tok.decode(out.token_ids, skip_special_tokens=True).rstrip("\ufffd")
            streamed = out.text.count("\ufffd")
            agree += whole.startswith(out.text) and streamed == whole.count("\ufffd")
            if streamed:
                broken += 1
                i = out.text.index("\ufffd")
                examples.append(out.text[max(0, i - 4):i + 4])
    result = {"bench": "invalid_utf8", "temperature": 1.0, "max_tokens": args.max_tokens, "answers": answers,
              "answers_with_u_fffd": broken, "streamed_equals_whole_decode": agree,
              "examples": examples[:10]}
    print(f"{answers} answers at temperature 1.0: {broken} hold a U+FFFD; in {agree} of "
          f"{answers} the streamed text has exactly the whole decode's", flush=True)
    write_json(args.json, "cpu", args, plan=eng.plan, **result)
    return result


if __name__ == "__main__":
    main()
