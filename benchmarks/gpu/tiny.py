"""A tiny random Llama, saved as a Hugging Face folder: the model of the GPU check's CPU dry run
and of the tests that run a real engine in a few seconds (the Triton interpreter, replays).

2 layers, 4 query / 2 KV heads of head dim 16, hidden 64, a word-level vocabulary of
`TINY_VOCAB` tokens ("w3" ... "w95"); the engine, transformers and the naive server all load
it. Its weights are fixed by `torch.manual_seed(0)`: the same folder on every machine.
"""

from __future__ import annotations

from pathlib import Path

TINY_VOCAB = 96


def save_tiny_llama(folder: str | Path) -> Path:
    """Write the tiny Llama to `folder` (kept if it is there already) and return the folder."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=True, initializer_range=0.2,  # peaked logits: no near-ties
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, TINY_VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<unk>",
    ).save_pretrained(folder)
    return folder
