"""Track fusion (recognition/fusion.py): the product rule, its calibration, the per-track memory, and the
ingest path deciding a track's second release from both."""

from __future__ import annotations

import numpy as np
import pytest
from peep.server.recognition.fusion import TrackFusion, fuse_pairs, fuse_posteriors, fused_background_scores


def test_one_release_is_its_own_posterior_and_two_follow_the_product_rule():
    priors = np.array([0.2, 0.3, 0.5])
    a, b = np.array([0.6, 0.3, 0.1]), np.array([0.5, 0.1, 0.4])
    assert np.array_equal(fuse_posteriors(a[None], priors), a)
    expected = a * b / priors
    np.testing.assert_allclose(fuse_posteriors(np.vstack([a, b]), priors), expected / expected.sum())
    # Two views agreeing on class 0 are surer of it than either alone.
    assert fuse_posteriors(np.vstack([a, b]), priors)[0] > max(a[0], b[0])


def test_a_class_zeroed_in_every_release_stays_zero_and_bad_shapes_are_refused():
    P = np.array([[0.0, 0.7, 0.3], [0.0, 0.2, 0.8]])  # class 0 erased: the recogniser zeroes it
    fused = fuse_posteriors(P, np.array([0.3, 0.3, 0.4]))
    assert fused[0] == 0.0 and fused.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="expected shapes"):
        fuse_posteriors(P, np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="priors: expected every class frequency > 0"):
        fuse_posteriors(P, np.array([0.0, 0.5, 0.5]))


def test_background_pairs_are_of_one_person_and_disjoint():
    P = np.eye(3)[[0, 0, 1, 1, 2]] * 0.9 + 0.1 / 3
    scores = fused_background_scores(P, ["a", "a", "b", "b", "c"], np.array([0, 1]), np.full(3, 1 / 3),
                                     np.random.default_rng(0))  # fmt: skip
    assert scores.shape == (2,)  # a's pair and b's pair; c alone has none


def test_a_track_remembers_its_last_release_per_model_version_and_forgets_it():
    now = [0.0]
    f = TrackFusion(ttl_s=10.0, max_tracks=2, clock=lambda: now[0])
    key = ("lobby", "cam-1", "t1")
    p1, p2, p3 = np.array([0.5, 0.5]), np.array([0.9, 0.1]), np.array([0.2, 0.8])
    assert f.add(key, "v1", p1) is None
    np.testing.assert_array_equal(f.add(key, "v1", p2), p1)
    np.testing.assert_array_equal(f.add(key, "v1", p3), p2)  # always the last one before
    assert f.add(key, "v2", p1) is None  # a new model: the old posteriors are not comparable
    now[0] = 11.0
    assert f.add(key, "v2", p2) is None  # the track went quiet for longer than ttl_s
    f.add(("lobby", "cam-1", "t2"), "v2", p1)
    f.add(("lobby", "cam-2", "t1"), "v2", p1)  # another device's track of the same name is another track
    assert len(f) <= 2  # bounded: the least recently seen went first
    with pytest.raises(ValueError, match="ttl_s"):
        TrackFusion(ttl_s=0)


def test_pairs_fused_at_once_are_each_pair_fused_alone(rng):
    priors = np.array([0.1, 0.2, 0.3, 0.4])
    A, B = rng.dirichlet(np.ones(4), size=5), rng.dirichlet(np.ones(4), size=5)
    A[2, 1] = B[2, 1] = 0.0  # an erased class in one pair
    together = fuse_pairs(A, B, priors)
    for i in range(5):
        np.testing.assert_allclose(together[i], fuse_posteriors(np.vstack([A[i], B[i]]), priors))
    assert together[2, 1] == 0.0


def test_fitting_calibrates_a_fused_threshold_on_background_people(rng):
    """Synthetic noisy templates: the fused unknown threshold is set, at most ~identify_far of fused held-out
    background pairs pass it, and fusing two releases identifies better than one."""
    from peep.server.recognition.fitting import fit_recogniser

    k, d = 6, 8
    centres = rng.normal(size=(k + 60, d)) * 1.2
    X, subj = [], []
    for c in range(k):  # enrolled
        X += list(centres[c] + rng.normal(size=(20, d)))
        subj += [f"s{c}"] * 20
    for b in range(60):  # background people, 6 templates each
        X += list(centres[k + b] + rng.normal(size=(6, d)))
        subj += [f"background:{b}"] * 6
    fitted = fit_recogniser(np.asarray(X, np.float32), subj, preset="lda", identify_far=0.1)
    cal = fitted.metrics["unknown_calibration"]
    assert fitted.unknown_threshold_fused is not None and cal["fused_pairs"] >= 20
    assert cal["fused_accepted_rate"] <= 0.1 + 1e-9
    assert fitted.class_priors is not None and fitted.class_priors.sum() == pytest.approx(1.0)
    known = fitted.known_indices
    single = fused = 0
    for c in range(k):
        x1, x2 = centres[c] + rng.normal(size=(2, 40, d))
        P1, P2 = fitted.predict_proba(x1.astype(np.float32)), fitted.predict_proba(x2.astype(np.float32))
        for a, b in zip(P1, P2, strict=True):
            single += int(fitted.class_names[known[np.argmax(a[known])]] == f"s{c}" and a[known].max()
                          >= fitted.unknown_threshold)  # fmt: skip
            f = fuse_posteriors(np.vstack([a, b]), fitted.class_priors)
            fused += int(fitted.class_names[known[np.argmax(f[known])]] == f"s{c}" and f[known].max()
                         >= fitted.unknown_threshold_fused)  # fmt: skip
    assert fused > single


def test_the_second_release_of_a_track_is_decided_from_both(trained_server, templates):
    """Ingest: two identify templates of one track; the first event is the template alone, the second is fused
    (releases_fused = 2) under the model's fused threshold; another track starts afresh."""
    from peep_testing.server import DEVICE, EventCollector

    model = trained_server.services.recogniser.model
    assert model.unknown_threshold_fused is not None and model.priors is not None
    stub = trained_server.stub()
    i, j = (int(v) for v in templates.test[110:112])
    msgs = [
        templates.message(i, track_id="fuse-1"),
        templates.message(j, track_id="fuse-1"),
        templates.message(j, track_id="fuse-2"),
    ]
    with EventCollector(trained_server, 3) as events:
        for m in msgs:
            stub.Ingest(m, metadata=DEVICE, timeout=5)
        got = events.wait()
    assert [e.releases_fused for e in got] == [1, 2, 1]
    assert [e.track_id for e in got] == ["fuse-1", "fuse-1", "fuse-2"]


def test_a_remembered_release_is_a_copy_the_caller_may_overwrite():
    f = TrackFusion()
    P = np.array([[0.9, 0.1], [0.2, 0.8]])
    f.add(("s", "d", "t"), "v1", P[0])
    P[0] = [0.5, 0.5]  # the recogniser writes the fused posterior over its row
    np.testing.assert_array_equal(f.add(("s", "d", "t"), "v1", P[1]), [0.9, 0.1])


def test_a_forgotten_track_is_recalled_from_the_store(trained_server, templates):
    """What a replica does when another took the track's first release: its memory is empty, the stored
    template is found and fused; a release captured *before* the stored one is not fused with it."""
    from peep.server.recognition.tracks import TrackIdentifier
    from peep_testing.server import DEVICE, EventCollector

    ingestor = trained_server.services.ingestor
    single = ingestor.tracks
    assert single.fuses and not single.shared  # SQLite: one process, its memory is complete
    ingestor.tracks = TrackIdentifier(single.recogniser, TrackFusion(), memory=trained_server.services.store)
    try:
        stub = trained_server.stub()
        i, j = (int(v) for v in templates.test[130:132])
        first = templates.message(i, track_id="recall-1")
        second = templates.message(j, track_id="recall-1")
        second.capture_time.FromNanoseconds(first.capture_time.ToNanoseconds() + 10_000_000)
        earlier = templates.message(j, track_id="recall-2")
        later = templates.message(i, track_id="recall-2")
        earlier.capture_time.FromNanoseconds(later.capture_time.ToNanoseconds() - 10_000_000)
        with EventCollector(trained_server, 4) as events:
            for a, b in ((first, second), (later, earlier)):
                stub.Ingest(a, metadata=DEVICE, timeout=5)
                ingestor.tracks.fusion = TrackFusion()  # as if the next release reached another replica
                stub.Ingest(b, metadata=DEVICE, timeout=5)
            got = {e.message_id: e.releases_fused for e in events.wait()}
    finally:
        ingestor.tracks = single
    assert got == {first.message_id: 1, second.message_id: 2, later.message_id: 1, earlier.message_id: 1}
