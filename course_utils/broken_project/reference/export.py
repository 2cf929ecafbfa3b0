"""Export the trained model to ONNX with a dynamic batch axis: `python export.py`."""
import argparse

import torch

from model import ShapesNet


def export(checkpoint: str, path: str) -> None:
    model = ShapesNet()
    state = torch.load(checkpoint, map_location="cpu")["model"]
    model.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
    model.eval()
    example = torch.randn(2, 1, 16, 16)
    torch.onnx.export(model, (example,), path, input_names=["images"], output_names=["logits"],
                      dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=1024)}}, dynamo=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", default="checkpoint.pt")
    parser.add_argument("--out", default="shapes.onnx")
    args = parser.parse_args()
    export(args.checkpoint, args.out)
    print(f"wrote {args.out}")
