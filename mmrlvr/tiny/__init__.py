"""Layer 4: tiny random-weight models of real architectures with locally trained tokenizers
(`build`: Qwen2-VL, Qwen2.5-VL; `audio`: Qwen2-Audio, Qwen2.5-Omni), and `vision_pretrain`,
which teaches a tiny vision tower to read before SFT."""
