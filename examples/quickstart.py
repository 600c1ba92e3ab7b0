"""Quickstart: exact speculative decoding with the default model in a few lines."""

import ngramspec

model, tokenizer = ngramspec.load_model()  # SmolLM2-135M-Instruct, or load_model("org/model")
text = "Fix the typos: The quick brwn fox jumpd over the lazzy dog. The quick brwn fox was happy."
messages = [{"role": "user", "content": text}]
encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
input_ids = encoded["input_ids"]

spec = ngramspec.NgramSpeculator()
output = model.generate(input_ids, ngram_speculator=spec, max_new_tokens=128)
print(tokenizer.decode(output[0, input_ids.shape[1]:], skip_special_tokens=True))
print(spec.last_stats)  # tokens, target forwards, MAT, acceptance, tokens/s
