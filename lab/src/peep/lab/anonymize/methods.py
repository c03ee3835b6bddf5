"""Anonymisers: one interface, every method (UPBA and the face-anonymisation baselines).

The contract (scikit-learn's, with the project's rule that declared
parameters are validated at construction, docs/CONVENTIONS.md items 4-5):

- keyword-only ``__init__`` whose parameters are the method's; a wrong type
  raises ``TypeError`` and a value out of range ``ValueError``, each naming
  the parameter, what was expected and what was received;
  ``get_params``/``set_params`` (``set_params`` validates again);
- ``fit(images, attribute=None, additional=None)`` learns what the method
  needs from a dataset (UPBA: the representation, feature importances and the
  pool its random sets are drawn from; the baselines: nothing);
- ``transform(images, attribute=None)`` anonymises records and returns an
  :class:`Anonymised` (faces in [0, 1] and per-record feature vectors);
  ``fit_transform`` anonymises the dataset it was fitted on.

The maths is in :mod:`peep.lab.anonymize.maths`. :data:`METHODS` is the one
list of methods; :func:`make_anonymiser` builds one from ``name=value``
parameters.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
from numpy.typing import NDArray
from peep.core.base import ParamsMixin, check_is_fitted
from peep.core.validation import check_int, check_real
from peep.lab.anonymize import maths

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
AnyFloats = NDArray[np.floating[Any]]


class AnonymiserError(ValueError):
    """A method, parameter or dataset an anonymiser cannot work with (names the parameter)."""


@dataclass(frozen=True)
class Anonymised:
    """What an anonymiser releases for a batch of records.

    Attributes
    ----------
    images : ndarray of shape (n_records, height, width), float32 in [0, 1]
        Anonymised faces (UPBA on eigenface coefficients: reconstructed).
    features : ndarray of shape (n_records, n_features), float32
        The anonymised records in the method's representation (UPBA:
        eigenface coefficients or pixels; the baselines: the pixels).
    representation : str
        ``"eigenfaces"`` or ``"pixels"``.
    """

    images: NDArray[np.float32]
    features: NDArray[np.float32]
    representation: str


def _images(images: Any) -> FloatArray:
    arr = np.asarray(images, dtype=np.float64)
    if arr.ndim != 3 or arr.shape[0] < 1:
        raise AnonymiserError(f"images: expected an array of shape (n_records, height, width), received {arr.shape}")
    return arr


def _labels(values: Any, n: int, name: str) -> IntArray:
    arr = np.asarray(values)
    if arr.shape != (n,) or not np.issubdtype(arr.dtype, np.integer):
        raise AnonymiserError(f"{name}: expected integer labels of shape ({n},), received {arr.dtype} {arr.shape}")
    return arr.astype(np.int64)


def _check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise AnonymiserError(f"{name}: expected one of {', '.join(choices)}, received {value!r}")
    return str(value)


def _rng(random_state: Any) -> np.random.Generator:
    if random_state is None or isinstance(random_state, (int, np.integer)):
        return np.random.default_rng(random_state)
    if isinstance(random_state, np.random.Generator):
        return random_state
    raise TypeError(f"random_state: expected None, an int or a numpy Generator, received {random_state!r}")


class Anonymiser(ParamsMixin):
    """Base of every anonymiser (see the module docstring for the contract)."""

    #: Name on the command line (``--method``).
    name: ClassVar[str] = ""
    #: One line: what it does.
    summary: ClassVar[str] = ""
    #: Whether fit/transform need the attribute of interest.
    needs_attribute: ClassVar[bool] = False

    def __init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        """Check every declared parameter (called at construction and by :meth:`set_params`)."""

    def set_params(self, **params: Any) -> Self:
        super().set_params(**params)
        self._validate()
        return self

    def fit(self, images: Any, attribute: Any = None, additional: Mapping[str, Any] | None = None) -> Self:
        """Learn what the method needs from a dataset.

        Parameters
        ----------
        images : array-like of shape (n_records, height, width), values in [0, 1]
        attribute : array-like of shape (n_records,), int, optional
            The attribute of interest (required when :attr:`needs_attribute`).
        additional : mapping of str to array-like of shape (n_records,), optional
            Further attributes whose utility should be kept (UPBA's ``r_q``).
        """
        imgs = _images(images)
        self.image_shape_ = (int(imgs.shape[1]), int(imgs.shape[2]))
        self.n_records_fit_ = int(imgs.shape[0])
        return self

    def transform(self, images: Any, attribute: Any = None) -> Anonymised:
        """Anonymise records (shape (n_records, height, width)); see :class:`Anonymised`."""
        check_is_fitted(self, ("image_shape_",))
        imgs = _images(images)
        if (imgs.shape[1], imgs.shape[2]) != self.image_shape_:
            raise AnonymiserError(
                f"images: expected faces of {self.image_shape_[0]}x{self.image_shape_[1]} pixels as in fit, "
                f"received {imgs.shape[1]}x{imgs.shape[2]}"
            )
        out = np.clip(self._transform_images(imgs), 0.0, 1.0).astype(np.float32)
        return Anonymised(images=out, features=out.reshape(out.shape[0], -1), representation="pixels")

    def _transform_images(self, images: FloatArray) -> FloatArray:
        raise NotImplementedError

    def fit_transform(
        self, images: Any, attribute: Any = None, additional: Mapping[str, Any] | None = None
    ) -> Anonymised:
        """:meth:`fit` on a dataset, then anonymise that same dataset."""
        return self.fit(images, attribute, additional).transform(images, attribute)

    def guarantee(self) -> str:
        """What the method promises, in one sentence (goes into every output)."""
        return "no formal guarantee: a transformation of each face"

    def describe(self) -> dict[str, Any]:
        """Name, parameters and guarantee, JSON-able."""
        params = {k: v for k, v in self.get_params(deep=False).items() if k != "random_state"}
        return {"method": self.name, "parameters": params, "guarantee": self.guarantee()}

    def own_protocol(
        self, original: AnyFloats, anonymised: AnyFloats, identity: IntArray, anchors: IntArray, seed: int
    ) -> dict[str, Any] | None:
        """The privacy figure of the method's own paper, where it has one beyond the shared protocols.

        Parameters
        ----------
        original, anonymised : ndarray of shape (n_records, height, width)
        identity : ndarray of shape (n_records,)
        anchors : ndarray of shape (n_anchors,)
            Records the figure is measured on (the evaluation's test faces).
        seed : int

        Returns
        -------
        dict or None
            JSON-able numbers (fractions in [0, 1]); None: the method has no own figure.
        """
        return None


class UPBA(Anonymiser):
    """Utility-Preserving Biometric Information Anonymization (Moriarty et al., Algorithm 1).

    Parameters
    ----------
    t : float, default 0.6
        Attribute purity of each random set, in [1/g, 1].
    g : int, default 32
        Size of each random set (the record included), at least 1 and at most
        the number of records fitted.
    r_p : float, default 0.01
        Fraction of features retained for the attribute of interest, in [0, 1].
    r_q : float, default 0.01
        Fraction retained for each additional attribute, in [0, 1].
    w : float, default 100
        Weight, >= 1: ``d' = mean(F)/w + ((w − 1)/w)·(X_I ⊙ d)``.
    representation : {"eigenfaces", "pixels"}, default "eigenfaces"
        Records are eigenface coefficients (PCA fitted on the dataset; faces
        reconstructed for the image output) or raw pixels.
    n_components : int, default 128
        Eigenfaces (capped at n_records − 1).
    n_estimators : int, default 100
        Trees of the random forests whose feature importances choose ``X_I``.
    random_state : None, int or numpy Generator
        Draws the random sets and seeds the forests.

    Attributes
    ----------
    importances_ : list of ndarray of shape (n_features,)
        The attribute of interest's, then each additional attribute's.
    mask_ : ndarray of shape (n_features,), bool
        ``X_I``.
    pool_ : ndarray of shape (n_records_fit, n_features)
        The fitted records; random sets are drawn from them.
    pool_attribute_ : ndarray of shape (n_records_fit,)
    """

    name = "upba"
    summary = "UPBA: weighted mean of a random set of purity t mixed with the record's most attribute-relevant features"
    needs_attribute = True
    REPRESENTATIONS = ("eigenfaces", "pixels")

    def __init__(
        self,
        *,
        t: float = 0.6,
        g: int = 32,
        r_p: float = 0.01,
        r_q: float = 0.01,
        w: float = 100.0,
        representation: str = "eigenfaces",
        n_components: int = 128,
        n_estimators: int = 100,
        random_state: Any = None,
    ) -> None:
        self.t = t
        self.g = g
        self.r_p = r_p
        self.r_q = r_q
        self.w = w
        self.representation = representation
        self.n_components = n_components
        self.n_estimators = n_estimators
        self.random_state = random_state
        super().__init__()

    def _validate(self) -> None:
        g = check_int(self.g, "g", low=1)
        check_real(self.t, "t")
        if not 1.0 / g - 1e-12 <= float(self.t) <= 1.0:
            raise AnonymiserError(
                f"t: expected a purity in [1/g, 1] = [{1.0 / g:.4g}, 1] for g = {g}, received {self.t}"
            )
        check_real(self.r_p, "r_p", low=0.0, high=1.0)
        check_real(self.r_q, "r_q", low=0.0, high=1.0)
        check_real(self.w, "w", low=1.0)
        _check_choice(self.representation, "representation", self.REPRESENTATIONS)
        check_int(self.n_components, "n_components", low=1)
        check_int(self.n_estimators, "n_estimators", low=1)
        _rng(self.random_state)

    def _features(self, flat: FloatArray) -> FloatArray:
        return _represent(self.eigenfaces_, flat)

    def fit(
        self,
        images: Any,
        attribute: Any = None,
        additional: Mapping[str, Any] | None = None,
        *,
        basis: UpbaBasis | None = None,
    ) -> Self:
        """See :meth:`Anonymiser.fit`; ``basis`` (from :func:`upba_basis` on the same records and attributes)
        replaces fitting the representation and the forests, so a sweep fits them once."""
        imgs = _images(images)
        n = imgs.shape[0]
        if attribute is None:
            raise AnonymiserError("attribute: expected the attribute of interest of every record, received none")
        attr = _labels(attribute, n, "attribute")
        if np.unique(attr).size < 2:
            raise AnonymiserError(
                f"attribute: expected at least 2 values among the records, received {np.unique(attr)}"
            )
        if self.g > n:
            raise AnonymiserError(f"g: expected at most the number of records in the dataset ({n}), received {self.g}")
        super().fit(imgs)
        self._rng_ = _rng(self.random_state)
        seed = int(self._rng_.integers(2**31 - 1))  # drawn either way, so the random sets do not depend on basis
        if basis is None:
            basis = upba_basis(
                imgs,
                attr,
                additional,
                representation=str(self.representation),
                n_components=int(self.n_components),
                n_estimators=int(self.n_estimators),
                seed=seed,
            )
        else:
            basis.check(self, n, 1 + len(additional or {}))
        self.eigenfaces_ = basis.eigenfaces
        self.importances_ = list(basis.importances)
        ratios = [float(self.r_p)] + [float(self.r_q)] * (len(self.importances_) - 1)
        self.mask_ = maths.retention_mask(self.importances_, ratios)
        self.pool_ = basis.features
        self.pool_attribute_ = attr
        return self

    def transform(self, images: Any, attribute: Any = None) -> Anonymised:
        return self._anonymise(images, attribute, None)

    def fit_transform(
        self,
        images: Any,
        attribute: Any = None,
        additional: Mapping[str, Any] | None = None,
        *,
        basis: UpbaBasis | None = None,
    ) -> Anonymised:
        self.fit(images, attribute, additional, basis=basis)
        return self._anonymise(images, attribute, np.arange(self.n_records_fit_, dtype=np.int64))

    def _anonymise(self, images: Any, attribute: Any, self_index: IntArray | None) -> Anonymised:
        check_is_fitted(self, ("mask_", "pool_"))
        imgs = _images(images)
        if attribute is None:
            raise AnonymiserError("attribute: expected the attribute of interest of every record, received none")
        attr = _labels(attribute, imgs.shape[0], "attribute")
        # the fitted records' features are the pool (fit_transform): not projected again
        feats = self.pool_ if self_index is not None else self._features(imgs.reshape(imgs.shape[0], -1))
        members = maths.upba_random_sets(
            self.pool_attribute_, attr, g=int(self.g), t=float(self.t), rng=self._rng_, self_index=self_index
        )
        mixed = maths.upba_mix(feats, maths.set_means(feats, self.pool_, members), self.mask_, float(self.w))
        faces = mixed if self.representation == "pixels" else self.eigenfaces_.inverse_transform(mixed)
        out = np.clip(faces, 0.0, 1.0).reshape(imgs.shape).astype(np.float32)
        return Anonymised(images=out, features=mixed.astype(np.float32), representation=str(self.representation))

    def guarantee(self) -> str:
        same, _ = maths.purity_counts(int(self.g), float(self.t))
        return (
            f"no formal guarantee: each record is mixed with a random set of {self.g} records ({same} sharing its "
            f"attribute value) at weight 1/{self.w:g}, and keeps {self.r_p:g} of its features ({self.r_q:g} per "
            "additional attribute) at weight (w-1)/w"
        )


def _represent(eigenfaces: Any, flat: FloatArray) -> FloatArray:
    """Records in UPBA's representation: eigenface coefficients, or the pixels when ``eigenfaces`` is None."""
    if eigenfaces is None:
        return flat
    out: FloatArray = eigenfaces.transform(flat)
    return out


@dataclass(frozen=True)
class UpbaBasis:
    """What UPBA learns from a dataset before drawing any random set: the same for every (t, g, w, r_p).

    Attributes
    ----------
    representation : str
    n_components, n_estimators : int
        As the UPBA parameters it was fitted with.
    eigenfaces : EigenfaceModel or None
        Fitted on the records (None for pixels).
    features : ndarray of shape (n_records, n_features)
        The records in the representation (UPBA's pool).
    importances : tuple of ndarray of shape (n_features,)
        Random-forest importances of the attribute of interest, then of each additional attribute.
    """

    representation: str
    n_components: int
    n_estimators: int
    eigenfaces: Any
    features: FloatArray
    importances: tuple[FloatArray, ...]

    def check(self, upba: UPBA, n_records: int, n_targets: int) -> None:
        """Refuse a basis fitted with other parameters, records or attributes than ``upba`` is given."""
        n_fitted = self.features.shape[0]
        ours = (self.representation, self.n_components, self.n_estimators, n_fitted, len(self.importances))
        theirs = (upba.representation, int(upba.n_components), int(upba.n_estimators), n_records, n_targets)
        if ours != theirs:
            raise AnonymiserError(
                "basis: expected one fitted with (representation, n_components, n_estimators, records, attributes) "
                f"= {theirs}, received {ours}"
            )


def upba_basis(
    images: Any,
    attribute: Any,
    additional: Mapping[str, Any] | None = None,
    *,
    representation: str = "eigenfaces",
    n_components: int = 128,
    n_estimators: int = 100,
    seed: int = 0,
    n_jobs: int = 1,
) -> UpbaBasis:
    """UPBA's representation and feature importances (Algorithm 1's random forests) of a dataset.

    Parameters
    ----------
    images : array-like of shape (n_records, height, width)
    attribute : array-like of shape (n_records,), int
    additional : mapping of str to array-like of shape (n_records,), optional
    representation, n_components, n_estimators
        As :class:`UPBA`'s parameters.
    seed : int
        Seeds the forests.
    n_jobs : int
        Threads of the forests (the importances do not depend on it).
    """
    from peep.core.eigenface_model import EigenfaceModel
    from sklearn.ensemble import RandomForestClassifier

    imgs = _images(images)
    n = imgs.shape[0]
    flat = imgs.reshape(n, -1)
    eigenfaces = None
    if _check_choice(representation, "representation", UPBA.REPRESENTATIONS) == "eigenfaces":
        eigenfaces = EigenfaceModel(n_components=min(int(n_components), n - 1)).fit(flat)
    feats = _represent(eigenfaces, flat)
    targets = [_labels(attribute, n, "attribute")] + [
        _labels(v, n, f"additional[{k}]") for k, v in (additional or {}).items()
    ]
    importances = tuple(
        np.asarray(
            RandomForestClassifier(n_estimators=int(n_estimators), random_state=seed, n_jobs=n_jobs)
            .fit(feats, y)
            .feature_importances_,
            dtype=np.float64,
        )
        for y in targets
    )
    return UpbaBasis(str(representation), int(n_components), int(n_estimators), eigenfaces, feats, importances)


class GaussianBlur(Anonymiser):
    """Gaussian blur of each face.

    Parameters
    ----------
    sigma : float, default 3.0
        Standard deviation of the kernel in pixels, > 0.
    """

    name = "blur"
    summary = "Gaussian blur"

    def __init__(self, *, sigma: float = 3.0) -> None:
        self.sigma = sigma
        super().__init__()

    def _validate(self) -> None:
        check_real(self.sigma, "sigma", low=0.0, low_inclusive=False)

    def _transform_images(self, images: FloatArray) -> FloatArray:
        return maths.gaussian_blur(images, float(self.sigma))


class Pixelate(Anonymiser):
    """Pixelation: each ``block × block`` cell replaced by its mean.

    Parameters
    ----------
    block : int, default 8
        Cell side in pixels, >= 2.
    """

    name = "pixelate"
    summary = "pixelation (cell means)"

    def __init__(self, *, block: int = 8) -> None:
        self.block = block
        super().__init__()

    def _validate(self) -> None:
        check_int(self.block, "block", low=2)

    def _transform_images(self, images: FloatArray) -> FloatArray:
        return maths.pixelate(images, int(self.block))


class KSamePixel(Anonymiser):
    """k-Same-Pixel (Newton, Sweeney & Malin 2005): each face replaced by the mean of its group of >= k faces.

    Groups are formed within each batch given to :meth:`transform` (the
    released set), so a batch needs at least ``k`` faces.

    Parameters
    ----------
    k : int, default 10
        Minimum group size, >= 2.
    random_state : None, int or numpy Generator
        Order in which faces seed groups.
    """

    name = "k-same"
    summary = "k-Same-Pixel: mean of each face's group of k nearest faces"

    def __init__(self, *, k: int = 10, random_state: Any = None) -> None:
        self.k = k
        self.random_state = random_state
        super().__init__()

    def _validate(self) -> None:
        check_int(self.k, "k", low=2)

    def _transform_images(self, images: FloatArray) -> FloatArray:
        n = images.shape[0]
        if self.k > n:
            raise AnonymiserError(f"k: expected at most the number of faces released together ({n}), received {self.k}")
        flat = images.reshape(n, -1)
        groups = maths.k_same_groups(flat, int(self.k), _rng(self.random_state).permutation(n))
        return maths.k_same_pixel(flat, groups).reshape(images.shape)

    def guarantee(self) -> str:
        return (
            f"k-anonymity of the released set against face matching (each face is the pixel mean of >= {self.k} "
            "faces); no protection is claimed against an adversary who trains on released faces"
        )


class DPPixel(Anonymiser):
    """Differentially private pixelisation (Fan 2018, DP-Pix).

    Parameters
    ----------
    epsilon : float, default 10.0
        ε per image, > 0: two images differing in at most ``m`` pixels are
        ε-indistinguishable.
    block : int, default 4
        Cell side in pixels, >= 1.
    m : int, default 16
        Pixels two neighbouring images may differ in, >= 1.
    random_state : None, NoiseSampler, int or numpy Generator
        ``None``: the secure sampler (OS CSPRNG, floating-point safe); a seed
        needs the ``"seeded-noise"`` feature (simulation only).
    """

    name = "dp-pixel"
    summary = "DP-Pix: pixelation plus Laplace noise, ε per image for m-pixel neighbours"

    def __init__(self, *, epsilon: float = 10.0, block: int = 4, m: int = 16, random_state: Any = None) -> None:
        self.epsilon = epsilon
        self.block = block
        self.m = m
        self.random_state = random_state
        super().__init__()

    def _validate(self) -> None:
        check_real(self.epsilon, "epsilon", low=0.0, low_inclusive=False)
        check_int(self.block, "block", low=1)
        check_int(self.m, "m", low=1)

    def _transform_images(self, images: FloatArray) -> FloatArray:
        from peep.core.mechanisms import LaplaceMechanism
        from peep.core.sampling import check_random_state

        if not hasattr(self, "_sampler"):
            self._sampler = check_random_state(self.random_state)
        sampler = self._sampler

        def noise(values: FloatArray, sensitivity: float) -> FloatArray:
            mech = LaplaceMechanism(epsilon=float(self.epsilon), sensitivity=sensitivity, random_state=sampler)
            return np.asarray(mech.randomise(values), dtype=np.float64)

        return maths.dp_pixelate(images, block=int(self.block), m=int(self.m), noise=noise)

    def guarantee(self) -> str:
        b = int(self.block)
        return (
            f"ε = {self.epsilon:g} per image (Fan 2018): images differing in at most m = {self.m} pixels are "
            f"ε-indistinguishable; Laplace scale m/(b²·ε) = {self.m / (b * b * float(self.epsilon)):.4g} on each "
            f"{b}x{b} cell mean (pixels in [0, 1]); every further release of the same face spends ε again"
        )


class SGAP(Anonymiser):
    """SGAP (Oleszkiewicz et al.), a learned privatizer: a generator trained by ``peep sgap train``, run from ONNX.

    Fitting learns nothing (the generator was trained beforehand, on LFW's
    background people only); transforming runs the generator with onnxruntime
    (:class:`peep.lab.sgap.runtime.SgapPrivatizer`, no torch) and, with
    ``enforce_ssim``, pulls any face below SSIM 1 − λ back to it.

    Parameters
    ----------
    model : str
        Path of the generator's ``sgap.onnx``; required.
    enforce_ssim : bool, default True
        Guarantee SSIM(original, privatized) >= 1 − λ on every face.
    """

    name = "sgap"
    summary = "SGAP: a generator trained against a Siamese identity discriminator (peep sgap train), run from ONNX"

    def __init__(self, *, model: str = "", enforce_ssim: bool = True) -> None:
        self.model = model
        self.enforce_ssim = enforce_ssim
        super().__init__()

    def _validate(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise AnonymiserError(
                f"model: expected the path of an SGAP generator (sgap.onnx from 'peep sgap train'; --model FILE or "
                f"--param sgap.model=FILE), received {self.model!r}"
            )
        if not Path(self.model).is_file():
            raise AnonymiserError(f"model: expected an existing sgap.onnx file, received {self.model!r} (no such file)")
        if not isinstance(self.enforce_ssim, bool):
            raise TypeError(f"enforce_ssim: expected a bool, received {type(self.enforce_ssim).__name__}")

    def fit(self, images: Any, attribute: Any = None, additional: Mapping[str, Any] | None = None) -> Self:
        from peep.lab.sgap.runtime import FACE_SHAPE, SgapModelError, SgapPrivatizer

        super().fit(images)
        if self.image_shape_ != FACE_SHAPE:
            raise AnonymiserError(
                f"images: expected faces of {FACE_SHAPE[0]}x{FACE_SHAPE[1]} pixels (the generator's), "
                f"received {self.image_shape_[0]}x{self.image_shape_[1]}"
            )
        try:
            self.privatizer_ = SgapPrivatizer.load(self.model, enforce_ssim=bool(self.enforce_ssim), threads=1)
        except SgapModelError as exc:
            raise AnonymiserError(f"model: {exc}") from exc
        return self

    def _transform_images(self, images: FloatArray) -> FloatArray:
        out = self.privatizer_.privatize(images.astype(np.float32))
        self.n_projected_ = int(self.privatizer_.n_projected_)
        return out.astype(np.float64)

    def guarantee(self) -> str:
        lam = getattr(getattr(self, "privatizer_", None), "lam", None)
        floor = f"SSIM(original, privatized) >= {1.0 - lam:g} per face" if lam is not None else "an SSIM floor"
        return (
            f"no formal guarantee: a learned generator trained to fool a Siamese identity discriminator under "
            f"{floor}{' (enforced)' if self.enforce_ssim else ''}; its privacy is what the evaluation measures"
        )

    def own_protocol(
        self, original: AnyFloats, anonymised: AnyFloats, identity: IntArray, anchors: IntArray, seed: int
    ) -> dict[str, Any] | None:
        """The paper's protocol: its own Siamese discriminator on pairs of the evaluated people.

        Each anchor (a test face) is paired with another photo of the same
        person or, for half of them, with someone else's photo (originals). The
        discriminator saved with the generator (``discriminator.onnx``; trained
        only on background people) judges (original anchor, partner) — how well
        it verifies faces at all — and (privatized anchor, partner); the
        paper's figure is the fooling rate, the share of same-person pairs it
        calls "different" once the anchor is privatized. None when the model
        has no discriminator beside it.
        """
        from peep.lab.sgap.pairs import sample_pairs
        from peep.lab.sgap.runtime import SgapDiscriminator

        d = SgapDiscriminator.beside(self.model)
        if d is None:
            return None
        totals = np.bincount(identity)
        usable = anchors[totals[identity[anchors]] >= 2]  # a same-person partner must exist
        if usable.size == 0 or np.count_nonzero(totals) < 2:
            return None
        pairs = sample_pairs(usable, identity, np.random.default_rng(seed), pool=np.arange(identity.size))
        truth = pairs.different >= 0.5
        real = d.p_different(original[pairs.a], original[pairs.b]) >= 0.5
        priv = d.p_different(anonymised[pairs.a], original[pairs.b]) >= 0.5
        return {
            "protocol": "the paper's own Siamese discriminator (trained with the generator on background people "
            "only) on (anchor, partner) pairs of the evaluated test faces, half the same person",
            "n_pairs": int(truth.size),
            "accuracy_real": float((real == truth).mean()),
            "accuracy_privatized": float((priv == truth).mean()),
            "fooling_rate": float(priv[~truth].mean()) if (~truth).any() else 0.0,
            "false_different_real": float(real[~truth].mean()) if (~truth).any() else 0.0,
        }

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        p = getattr(self, "privatizer_", None)
        if p is not None:
            out["model"] = {"sha256": p.sha256, "lambda": p.lam, "training": p.metadata.get("population")}
            if hasattr(self, "n_projected_"):
                out["model"]["faces_pulled_back_to_ssim_floor"] = self.n_projected_
        return out


#: Every method, by its command-line name.
METHODS: dict[str, type[Anonymiser]] = {c.name: c for c in (UPBA, GaussianBlur, Pixelate, KSamePixel, DPPixel, SGAP)}


def method_parameters(name: str) -> dict[str, Any]:
    """Declared parameters of method ``name`` and their defaults (``random_state`` excluded)."""
    cls = method_class(name)
    sig = inspect.signature(cls.__init__)
    return {p.name: p.default for p in sig.parameters.values() if p.name not in ("self", "random_state")}


def method_class(name: str) -> type[Anonymiser]:
    try:
        return METHODS[name]
    except KeyError:
        raise AnonymiserError(f"method: expected one of {', '.join(METHODS)}, received {name!r}") from None


def parse_value(name: str, parameter: str, text: str) -> Any:
    """A parameter's value from text, typed like its default (``--param g=32``)."""
    defaults = method_parameters(name)
    if parameter not in defaults:
        raise AnonymiserError(
            f"--param: expected a parameter of {name} ({', '.join(defaults)}), received {parameter!r}"
        )
    default = defaults[parameter]
    try:
        if isinstance(default, bool):
            return text.lower() in ("1", "true", "yes")
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        raise AnonymiserError(
            f"--param {name}.{parameter}: expected a {type(default).__name__}, received {text!r}"
        ) from None
    return text


def make_anonymiser(name: str, params: Mapping[str, Any] | None = None, *, random_state: Any = None) -> Anonymiser:
    """Build method ``name`` with ``params`` (validated now); ``random_state`` where the method takes one."""
    cls = method_class(name)
    kwargs = dict(params or {})
    if "random_state" in inspect.signature(cls.__init__).parameters:
        kwargs["random_state"] = random_state
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise AnonymiserError(f"--param {name}: {exc}") from exc
