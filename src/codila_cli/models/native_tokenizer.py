"""The tokenizer of the native engine (models/native.py): a transformers fast tokenizer's surface on
the ``tokenizers`` library alone, so a bundled-model run never imports transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class NativeTokenizer:
    """The part of a transformers fast tokenizer that codila uses, on the ``tokenizers`` library alone.

    ``specials`` maps ``bos_token`` … ``mask_token`` to their strings, as models/tokens.py::load_tokenizer
    reads them from tokenizer_config.json; there is no chat template (that path uses transformers)."""

    chat_template = None

    def __init__(self, file: Path, specials: dict[str, str]) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(file))
        for key in ("bos", "eos", "pad", "unk", "mask"):
            text = specials.get(f"{key}_token")
            setattr(self, f"{key}_token", text)
            setattr(self, f"{key}_token_id", self._tok.token_to_id(text) if text is not None else None)
        self.added_tokens_decoder = self._tok.get_added_tokens_decoder()
        self.all_special_tokens = [t for t in (self.bos_token, self.eos_token, self.unk_token, self.pad_token,
                                               self.mask_token) if t is not None]

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_text(self, text: str) -> list[int]:
        """Special-token strings in ``text`` encoded as text (models/tokens.py::encode_text)."""
        self._tok.encode_special_tokens = True
        try:
            return self._tok.encode(text, add_special_tokens=False).ids
        finally:
            self._tok.encode_special_tokens = False

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Any) -> Any:
        if isinstance(ids, int):
            return self._tok.id_to_token(ids)
        return [self._tok.id_to_token(int(i)) for i in ids]

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)
