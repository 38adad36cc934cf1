"""By hand, in the fixture generator's environment (transformers): an export of a model trained on
`upipe tokenize` bytes loads with AutoTokenizer, maps text to its bytes and back, and generates
through pipeline("text-generation").
Usage: /tmp/hf/bin/python tools/check_export_tokenizer.py EXPORT_DIR TEXT_FILE"""
import sys
from transformers import AutoTokenizer, AutoModelForCausalLM, pipeline
d = sys.argv[1]
tok = AutoTokenizer.from_pretrained(d)
text = open(sys.argv[2], encoding="utf-8").read()[:5000]
ids = tok(text)["input_ids"]
raw = list(text.encode())
assert ids == raw, "ids differ from bytes"
assert tok.decode(ids) == text, "round trip"
s = "héllo wörld\n\t ~!"
assert tok(s)["input_ids"] == list(s.encode()), tok(s)["input_ids"]
assert tok.decode(list(s.encode())) == s
m = AutoModelForCausalLM.from_pretrained(d)
p = pipeline("text-generation", model=m, tokenizer=tok)
out = p("the quick", max_new_tokens=20, do_sample=False)
print("generated:", repr(out[0]["generated_text"]))
print("OK")
