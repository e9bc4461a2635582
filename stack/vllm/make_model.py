"""Makes the local stack's model for real vLLM, offline: a small random-weight Llama and a
byte-level BPE tokenizer trained on text the project ships (corpus.txt beside this file).

Nothing is downloaded: the weights come from a seeded random initialisation, the tokenizer
from `tokenizers` trained on the corpus. The latencies vLLM serves it with are real (the
model's shapes set the compute), its text is noise, which is all a router needs.

    python make_model.py --out DIR [--hidden 256 --layers 4 ...]

Writes DIR/{config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
generation_config.json, headroom-model.json}; the last records the arguments, and a DIR whose
record matches them is left as it is (the stack calls this on every start).
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# A chat template vLLM's /v1/chat/completions renders: each message on its own line,
# then the assistant's turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--corpus", default=os.path.join(HERE, "corpus.txt"))
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--max-position", type=int, default=4096)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


def record_of(args):
    with open(args.corpus, "rb") as f:
        corpus_bytes = len(f.read())
    fields = {k: v for k, v in vars(args).items() if k not in ("out", "corpus")}
    fields["corpus_bytes"] = corpus_bytes
    fields["format"] = 2
    return fields


def train_tokenizer(args, out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with open(args.corpus, encoding="utf-8") as f:
        lines = [line for line in f if not line.startswith("#")]
    tok.train_from_iterator(lines, trainer=trainer)
    tok.save(os.path.join(out, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "pad_token": "<|pad|>",
        "model_max_length": args.max_position,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return tok


def silence_unprintable(model, tok):
    """Zeroes the embedding of every token that decodes to no text of its own: the special
    tokens, and byte tokens that are part of a UTF-8 character. The embeddings are tied, so
    such a token's logit is 0 at every step while the printable ones' are random around 0:
    greedy decoding never picks one, and sampling rarely does. Every generated token then
    streams as text, which is how a client (and the gateway's meter) sees a token arrive;
    random weights otherwise settle on a special token, which streams as nothing."""
    import torch

    from tokenizers import decoders

    decoder = decoders.ByteLevel()
    silent = []
    for token, index in tok.get_vocab().items():
        text = decoder.decode([token])
        if index < 3 or not text or "\ufffd" in text:
            silent.append(index)
    with torch.no_grad():
        model.get_input_embeddings().weight[silent] = 0.0
    return len(silent)


def make_weights(args, out, tok):
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=args.max_position,
        tie_word_embeddings=True,
        bos_token_id=tok.token_to_id("<|begin_of_text|>"),
        eos_token_id=tok.token_to_id("<|end_of_text|>"),
        pad_token_id=tok.token_to_id("<|pad|>"),
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config)
    silence_unprintable(model, tok)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # Greedy-free sampling defaults of its own: nothing in a request depends on them.
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id).save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def main():
    args = parse()
    out = os.path.abspath(args.out)
    record = record_of(args)
    stamp = os.path.join(out, "headroom-model.json")
    try:
        with open(stamp) as f:
            if json.load(f) == record:
                print(f"model: {out} (already made)")
                return 0
    except (OSError, ValueError):
        pass
    os.makedirs(out, exist_ok=True)
    tok = train_tokenizer(args, out)
    params = make_weights(args, out, tok)
    with open(stamp, "w") as f:
        json.dump(record, f, indent=2)
    print(f"model: {out} ({params / 1e6:.1f}M parameters, vocab {tok.get_vocab_size()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
