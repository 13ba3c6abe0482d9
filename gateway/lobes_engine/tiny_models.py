"""Build the tiny chat and embedding models, offline and byte for byte the same every run.

    ENGINE_VENV/bin/python tiny_models.py OUT_DIR   # writes OUT_DIR/tiny-chat, OUT_DIR/tiny-embed

Runs under the engine's own venv (torch, transformers and tokenizers come with vLLM's CPU
build). Random weights after a fixed seed and a byte-level BPE tokenizer trained on the first
source files of the pinned vLLM package itself, text that is the same wherever that build is
installed: the text is gibberish, the protocol is the real engine's. No hub is reached.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import vllm
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    BertConfig,
    BertModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

# The checkpoints' names under a box's model directory (lobes/tiny-chat, lobes/tiny-embed).
CHAT = "tiny-chat"
EMBED = "tiny-embed"
VOCAB_SIZE = 4096
TRAINING_FILES = 200
SEED = 0
# The hermes tool parser finds these in the vocabulary and reads them from the decoded text:
# plain added tokens, not special ones (special tokens are skipped when decoding).
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
CHAT_SPECIAL = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
EMBED_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# ChatML, with tools listed in a system turn and calls written as the hermes parser reads them.
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}\n{{ messages[0].content }}\n{%- endif %}\n"
    "You may call one or more functions. The functions, within <tools></tools>:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    "Answer each call as <tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}"
    "<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{%- if message.content %}{{ message.content }}{%- endif %}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set call = call.function if call.function is defined else call %}"
    "\n<tool_call>\n{\"name\": \"{{ call.name }}\", \"arguments\": "
    "{{ call.arguments if call.arguments is string else call.arguments | tojson }}}\n"
    "</tool_call>"
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}"
    "\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def training_text() -> list[str]:
    """The first TRAINING_FILES source files of the installed vLLM, by sorted path."""
    package = Path(vllm.__file__).parent
    files = sorted(package.rglob("*.py"), key=lambda path: path.relative_to(package).as_posix())
    return [path.read_text(encoding="utf-8") for path in files[:TRAINING_FILES]]


def bpe_tokenizer(special: list[str]) -> Tokenizer:
    """A byte-level BPE trained on the training text (BPE's training is deterministic)."""
    tokenizer = Tokenizer(models.BPE(unk_token=special[1] if special[0] == "[PAD]" else special[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(training_text(), trainer=trainer)
    return tokenizer


def build_chat(out: Path) -> None:
    """A Llama decoder (head size 64, which the CPU attention kernels support) and its
    ChatML tokenizer, <|im_end|> its end of sequence."""
    tokenizer = bpe_tokenizer(CHAT_SPECIAL)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>",
                                   bos_token="<s>", eos_token="<|im_end|>", pad_token="</s>")
    fast.add_tokens(TOOL_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    fast.save_pretrained(out)


def build_embed(out: Path) -> None:
    """A BERT encoder without a pooling layer (vLLM serves it on /v1/embeddings) and a BPE
    tokenizer that wraps each text as [CLS] text [SEP]."""
    tokenizer = bpe_tokenizer(EMBED_SPECIAL)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]",
                                   pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                                   mask_token="[MASK]", model_max_length=512)
    config = BertConfig(vocab_size=len(fast), hidden_size=128, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=256,
                        max_position_embeddings=512, pad_token_id=fast.pad_token_id)
    torch.manual_seed(SEED)
    model = BertModel(config, add_pooling_layer=False).to(torch.bfloat16)
    model.save_pretrained(out)
    fast.save_pretrained(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    out = Path(argv[0])
    build_chat(out / CHAT)
    build_embed(out / EMBED)
    print(json.dumps({CHAT: str(out / CHAT), EMBED: str(out / EMBED)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
