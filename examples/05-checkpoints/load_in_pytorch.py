# Loads the state dict polyshard-checkpoints writes (model.safetensors) into nanoGPT's GPT, the
# PyTorch model with the same names and nn.Linear layout. Run next to nanoGPT's model.py.
# [pytorch]
from safetensors.torch import load_file
from model import GPT, GPTConfig          # nanoGPT

model = GPT(GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=32, bias=True))
state = load_file("model.safetensors")    # dict of name -> torch.Tensor; no pickle, no code run
missing, unexpected = model.load_state_dict(state, strict=False)
assert not unexpected and all(k.endswith(".attn.bias") for k in missing)   # nanoGPT's mask buffer
# [pytorch]
