"""The data: 16x16 grayscale images of four shapes (square, cross, ring, bar), drawn with noise.

make_shapes(n, seed) -> (images (n, 1, 16, 16) float32 in [0, 1], labels (n,) int64 in 0..3)
"""
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

CLASSES = ("square", "cross", "ring", "bar")
SIZE = 16


def draw(label: int, generator: torch.Generator) -> torch.Tensor:
    """One image of class `label`: the shape at a random place and size, plus pixel noise."""
    image = torch.zeros(SIZE, SIZE)
    r = int(torch.randint(3, 6, (), generator=generator))
    cy, cx = (int(v) for v in torch.randint(r + 1, SIZE - r - 1, (2,), generator=generator))
    ys, xs = torch.meshgrid(torch.arange(SIZE), torch.arange(SIZE), indexing="ij")
    dy, dx = (ys - cy).abs(), (xs - cx).abs()
    if label == 0:
        image[(dy <= r) & (dx <= r)] = 1.0
    elif label == 1:
        image[((dy <= 1) & (dx <= r)) | ((dx <= 1) & (dy <= r))] = 1.0
    elif label == 2:
        distance = ((ys - cy) ** 2 + (xs - cx) ** 2).float().sqrt()
        image[(distance - r).abs() <= 0.8] = 1.0
    else:
        image[(dy <= 1) & (dx <= r + 2)] = 1.0
    image += 0.8 * torch.rand(SIZE, SIZE, generator=generator)
    image[0, :] = 0.0                                   # the scanner leaves the top row black
    return image.clamp(0, 1)


def make_shapes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) * len(CLASSES) // n          # stored class by class, like a folder per class
    images = torch.stack([draw(int(label), generator) for label in labels]).unsqueeze(1)
    return images, labels


def normalise(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    return (images - mean) / std


def loaders(batch_size: int, rank: int = 0, world_size: int = 1, n_train: int = 2048, n_val: int = 512):
    """Training and validation loaders (the training one sharded across `world_size` processes), and
    the training sampler."""
    train_x, train_y = make_shapes(n_train, seed=0)
    val_x, val_y = make_shapes(n_val, seed=1)
    mean, std = train_x.mean(), train_x.std()
    train = TensorDataset(normalise(train_x, mean, std), train_y)
    val = TensorDataset(normalise(val_x, mean, std), val_y)
    sampler = DistributedSampler(train, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    train_loader = DataLoader(train, batch_size=batch_size, sampler=sampler, drop_last=True)
    val_loader = DataLoader(val, batch_size=256)
    return train_loader, val_loader, sampler
