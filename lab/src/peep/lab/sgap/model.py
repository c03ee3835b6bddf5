"""SGAP's two networks and its differentiable SSIM, in PyTorch (training only).

Oleszkiewicz, Kairouz, Piczak, Rajagopal & Trzciński, "Siamese Generative
Adversarial Privatizer for Biometric Data" (ACCV 2018 workshops), for PEEP's
62×47 grayscale faces in [0, 1]. Importing this module imports torch: only
:mod:`peep.lab.sgap.train` does; inference runs the exported ONNX graph
(:mod:`peep.lab.sgap.runtime`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: Face geometry (height, width) of every PEEP face: ``FaceGeometry()`` and LFW's fixed crop.
FACE_SHAPE = (62, 47)
#: The generator works on a 64×48 canvas (edge-padded), so four stride-2 halvings are exact.
_CANVAS = (64, 48)
LEAK = 0.1


def _down(c_in: int, c_out: int, *, norm: bool) -> nn.Sequential:
    """4×4 convolution, stride 2, padding 1 (halves each side), batch norm, leaky ReLU 0.1."""
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, 4, stride=2, padding=1, bias=not norm)]
    if norm:
        layers.append(nn.BatchNorm2d(c_out))
    layers.append(nn.LeakyReLU(LEAK))
    return nn.Sequential(*layers)


def _up(c_in: int, c_out: int) -> nn.Sequential:
    """The mirror of :func:`_down`: 4×4 transposed convolution, stride 2, padding 1 (doubles each side)."""
    return nn.Sequential(
        nn.ConvTranspose2d(c_in, c_out, 4, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.LeakyReLU(LEAK),
    )


class Generator(nn.Module):
    """The privatizer: a convolutional encoder–decoder with bypasses between mirrored layers.

    The encoder is four blocks of 4×4 convolutions with stride 2 and padding 1,
    batch norm (not on the first block, as in pix2pix) and leaky ReLU 0.1:
    64×48 → 32×24 → 16×12 → 8×6 → 4×3. The decoder mirrors it with transposed
    convolutions, each block's output concatenated with the encoder output of
    the same size (the paper's "bypasses"), and a last transposed convolution
    to one channel. The face (62×47) is edge-padded to 64×48 on the way in and
    cropped back on the way out.

    The paper's generator is "VAE-like"; this one is deterministic (no sampled
    code), so that one face always privatizes to the same image and the ONNX
    graph has no random node. Its output is the input plus a bounded change,
    ``clip(x + tanh(decoder(x)), 0, 1)``, and that last layer starts at zero: an
    untrained generator is the identity (SSIM 1), and training moves away from
    it only as far as the SSIM constraint allows.

    Parameters
    ----------
    width : int
        Channels of the first encoder block (doubled at each block): 16 gives
        ~0.4 M parameters, a 1.6 MB ONNX file.

    Input and output: tensor of shape (n, 1, 62, 47), values in [0, 1].
    """

    def __init__(self, *, width: int = 16) -> None:
        super().__init__()
        w = width
        self.width = width
        self.enc1 = _down(1, w, norm=False)
        self.enc2 = _down(w, 2 * w, norm=True)
        self.enc3 = _down(2 * w, 4 * w, norm=True)
        self.enc4 = _down(4 * w, 8 * w, norm=True)
        self.dec4 = _up(8 * w, 4 * w)
        self.dec3 = _up(8 * w, 2 * w)
        self.dec2 = _up(4 * w, w)
        self.dec1 = nn.ConvTranspose2d(2 * w, 1, 4, stride=2, padding=1)
        nn.init.zeros_(self.dec1.weight)
        assert self.dec1.bias is not None  # constructed with bias=True
        nn.init.zeros_(self.dec1.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = FACE_SHAPE
        ch, cw = _CANVAS
        top, left = (ch - h) // 2, (cw - w) // 2
        # Edge padding, not zeros: a black frame would be an edge the encoder sees on every face.
        canvas = F.pad(x, (left, cw - w - left, top, ch - h - top), mode="replicate")
        e1 = self.enc1(canvas)
        e2 = self.enc2(e1)
        e3 = self.enc3(e2)
        e4 = self.enc4(e3)
        d4 = self.dec4(e4)
        d3 = self.dec3(torch.cat([d4, e3], dim=1))
        d2 = self.dec2(torch.cat([d3, e2], dim=1))
        delta = torch.tanh(self.dec1(torch.cat([d2, e1], dim=1)))
        out = torch.clamp(canvas + delta, 0.0, 1.0)
        return out[:, :, top : top + h, left : left + w]


class SiameseDiscriminator(nn.Module):
    """Two weight-shared branches and a margin-based mapping of their distance to P(different people).

    Each branch: three blocks of a 3×3 convolution (stride 1, padding 1), leaky
    ReLU 0.1, batch norm and dropout 0.2, each followed by 2×2 max pooling
    (62×47 → 31×23 → 15×11 → 7×5; without it the first dense layer would have
    ~190 k inputs per channel block), then two dense layers (the second is the
    embedding). With ``d`` the Euclidean distance of the two embeddings,
    ``P(different) = sigmoid((d − margin) / temperature)``: pairs closer than the
    margin are called the same person. The loss is cross-entropy on that
    probability (:func:`discriminator_loss`).

    Parameters
    ----------
    channels : tuple of 3 int
    hidden : int
        Width of the first dense layer.
    embedding : int
        Width of the second dense layer (the embedding).
    margin, temperature : float
        The distance mapping.
    """

    def __init__(
        self,
        *,
        channels: tuple[int, int, int] = (16, 32, 64),
        hidden: int = 256,
        embedding: int = 64,
        margin: float = 1.0,
        temperature: float = 0.25,
    ) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        c_in = 1
        for c in channels:
            blocks += [
                nn.Conv2d(c_in, c, 3, stride=1, padding=1),
                nn.LeakyReLU(LEAK),
                nn.BatchNorm2d(c),
                nn.Dropout(0.2),
                nn.MaxPool2d(2),
            ]
            c_in = c
        self.features = nn.Sequential(*blocks)
        h, w = FACE_SHAPE
        for _ in channels:
            h, w = h // 2, w // 2
        self.dense = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c_in * h * w, hidden),
            nn.LeakyReLU(LEAK),
            nn.Linear(hidden, embedding),
        )
        self.margin = margin
        self.temperature = temperature

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """One branch: faces of shape (n, 1, 62, 47) → embeddings of shape (n, embedding)."""
        out: torch.Tensor = self.dense(self.features(x))
        return out

    def distance(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # The epsilon keeps the gradient of the norm finite for identical embeddings.
        return torch.sqrt(((self.embed(a) - self.embed(b)) ** 2).sum(dim=1) + 1e-8)

    def logit_different(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Logit of P(a and b show different people), shape (n,)."""
        return (self.distance(a, b) - self.margin) / self.temperature

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """P(a and b show different people), shape (n,)."""
        return torch.sigmoid(self.logit_different(a, b))


def discriminator_loss(logit_different: torch.Tensor, different: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of P(different) against the truth (1 = different people)."""
    return F.binary_cross_entropy_with_logits(logit_different, different)


def ssim(x: torch.Tensor, y: torch.Tensor, *, win_size: int = 7) -> torch.Tensor:
    """Mean SSIM per image, differentiable, equal to scikit-image's default ``structural_similarity``.

    A uniform ``win_size``² window, sample covariances (N/(N−1)), K1 = 0.01,
    K2 = 0.03, data range 1, averaged over the windows that fit inside the
    image — scikit-image's defaults, so the number training constrains is the
    one the evaluation reports.

    Parameters
    ----------
    x, y : tensor of shape (n, 1, height, width), values in [0, 1]

    Returns
    -------
    tensor of shape (n,)
    """
    c1, c2 = 0.01**2, 0.03**2
    n_px = win_size * win_size
    kernel = torch.full((1, 1, win_size, win_size), 1.0 / n_px, dtype=x.dtype, device=x.device)

    def mean(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, kernel)

    ux, uy = mean(x), mean(y)
    cov_norm = n_px / (n_px - 1)
    vx = cov_norm * (mean(x * x) - ux * ux)
    vy = cov_norm * (mean(y * y) - uy * uy)
    vxy = cov_norm * (mean(x * y) - ux * uy)
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    return s.mean(dim=(1, 2, 3))
