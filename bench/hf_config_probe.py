#!/usr/bin/env python3
"""What transformers makes of a config.json that fp4rl_model_save_pretrained wrote: the RoPE
parameters it resolves, and the logits check of check_saved_with_hf.py with and without the
top-level "rope_theta" (run on the GPU machine: python3 bench/hf_config_probe.py DIR)."""
import json, os, shutil, subprocess, sys
from transformers import AutoConfig
d = sys.argv[1].rstrip("/")
c = AutoConfig.from_pretrained(d)
print("as written:", getattr(c, "rope_parameters", None), "rope_theta attr:", getattr(c, "rope_theta", None),
      "head_dim:", getattr(c, "head_dim", None), "layer_types:", getattr(c, "layer_types", None))
alt = d + "_noroot"
shutil.rmtree(alt, ignore_errors=True); shutil.copytree(d, alt)
for ext in (".tokens.i32", ".logits.f32"): shutil.copy(d + ext, alt + ext)
cfg = json.load(open(alt + "/config.json")); cfg.pop("rope_theta", None)
json.dump(cfg, open(alt + "/config.json", "w"), indent=2)
c2 = AutoConfig.from_pretrained(alt)
print("without top-level rope_theta:", getattr(c2, "rope_parameters", None))
here = os.path.dirname(os.path.abspath(__file__))
subprocess.run([sys.executable, os.path.join(here, "..", "tests", "fixtures", "check_saved_with_hf.py"), alt])
