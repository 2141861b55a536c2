"""Read one model directory's tokenizer into core's `TokenizerFacts`, offline: one loader per file kind.

Nothing here can reach the network: files are read from the directory and parsed directly (never a hub
API), so HF_HUB_OFFLINE holds by construction. Each loader takes a file's bytes and returns typed facts or
raises `FileProblem` with the reason `tokenizer.files` reports:

- `tokenizer_json`   tokenizer.json (vocabulary, merges, added tokens, pipeline), parsed as JSON
- `sentencepiece`    tokenizer.model as a SentencePiece protobuf (no sentencepiece/protobuf library)
- `tiktoken`         *.tiktoken rank files and tiktoken-format tokenizer.model
- `tokenizer_config` tokenizer_config.json, special_tokens_map.json, chat_template.jinja
- `generation_config` generation_config.json
- `model_config`     config.json (joined with `weights`)
- `safetensors`, `weights`  safetensors headers, lm_head/embedding rows, the EAGLE3 d2t/t2d tensors
  (standard library only: no torch, no numpy)

`source` picks the file that defines the tokenizer, `directory.load_tokenizer_dir` composes everything
(the only code that touches the directory besides `weights`), `encoder` wraps the tokenizers library for
probes, and `hashes` gives fleet mode its remote sha256 command and parser. The shared pieces are `files`
(which files, read once, `FileProblem`) and `jsonfile`.
"""
