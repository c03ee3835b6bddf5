"""The steps of ``peep demo``, each a unit with its own inputs and outputs; the runner lists them in order.

Every step takes the run's :class:`~peep.lab.demo.steps.context.RunContext` (options, output folder,
site, tokens) and what the earlier steps returned, and returns its own output:

============================  =====================================  =====================================
step                          function                               returns
============================  =====================================  =====================================
choosing people               :func:`people.choose_from_lfw`         :class:`people.People`
keys and a signed bundle      :func:`bundle.keys_and_bundle`         :class:`bundle.Keys`,
                                                                     :class:`bundle.FittedBundle`
starting the server           :func:`server.start_server`            :class:`server.DemoServer`
enrolling at the desks        :func:`enrolment.enrol_at_desks`       nothing (raises if a desk stopped)
the background population     :func:`enrolment.enrol_background`     nothing
training                      :func:`enrolment.train`                the summary's ``model``
soft traits (QBBS)            :func:`soft_traits.enrol_soft_traits`  the subjects' traits
composing the videos          :func:`cameras.compose_videos`         :class:`cameras.Videos`
the camera agents             :func:`cameras.run_cameras`            :class:`cameras.CameraRun`
verifying claims              :func:`verification.verify_claims`     the summary's ``verification``
the door                      :func:`door.door_claims`               the summary's ``door``
the summary                   :func:`results.summarise`              the summary
the console (``--console``)   :func:`server.open_console`            its URL and one-time password
============================  =====================================  =====================================

:func:`output.fresh_out` clears an earlier run's state before the first step and
:func:`output.write_results` writes ``summary.json``, ``releases.json`` and ``report.html`` after the last.
"""
