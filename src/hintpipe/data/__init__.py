"""Data at the size users train on: sources read as streams, tokenized once into memory-mapped shards, and read
by the documents a step draws.

The path of a corpus, from the user's files to a step's micro-batches:

1. **Sources** (:mod:`~hintpipe.data.sources`): what ``--data`` names: a plain-text file (documents split by
   :mod:`~hintpipe.data.split`), a JSONL file, a folder of them, a Hugging Face ``datasets`` dataset
   (:mod:`~hintpipe.data.hf_datasets`), or a folder prepared before; several with weights.
2. **Prepare** (:mod:`~hintpipe.data.prepare`): the sources' documents tokenized once
   (:mod:`~hintpipe.data.tokenizer`) into token shards and a document index (:mod:`~hintpipe.data.shards`),
   with a manifest (:mod:`~hintpipe.data.manifest`) that says what they were made from; by
   ``hintpipe data prepare``, or on a run's first use into a cache folder (:mod:`~hintpipe.data.cache`).
3. **Read** (:mod:`~hintpipe.data.prepared`): a process maps the shards and reads the documents it draws, no
   more; several sources are drawn in their weights' proportion (:mod:`~hintpipe.data.mixture`).
4. **A run's data** (:mod:`~hintpipe.data.run_data`): the run's ``--data`` entries checked and prepared once,
   before any rank starts; the ranks only open what was prepared.

The whole package is torch-free: the launcher prepares without torch, and the ranks turn the documents into
tensors themselves (:mod:`hintpipe.apps.corpus`).
"""
