"""A character-level tokenizer for the embedded task, built with `tokenizers` and saved
as an ordinary HF tokenizer (it reloads through `AutoTokenizer.from_pretrained`)."""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from stopexp.core.protocol import TOY_CHARS as CHARS, TOY_SPECIALS

SPECIALS = list(TOY_SPECIALS)


def build_char_tokenizer(chars: str = CHARS) -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(chars))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    # Every sequence starts with <s>, as for a real Llama tokenizer.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        unk_token="<unk>", padding_side="left")
