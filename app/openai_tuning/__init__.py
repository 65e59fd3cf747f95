"""OpenAI's fine-tuning API on the dashboard: `/v1/files` and `/v1/fine_tuning/jobs`.

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:7860/v1", api_key="user:password")   # any key without a login
    kept = client.files.create(file=open("train.jsonl", "rb"), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model="tiny-llama", training_file=kept.id)
    client.fine_tuning.jobs.list_events(job.id)          # the loss by step, newest first
    client.chat.completions.create(model=client.fine_tuning.jobs.retrieve(job.id).fine_tuned_model, ...)

A job is a tunedeck run, queued through the form's and the CLI's one submit path with the dashboard's access
policy: `create` maps OpenAI's fields onto the spec (`app.openai_tuning.create`) and refuses, before anything
is queued, what the check refuses, in OpenAI's error shape naming OpenAI's parameter. Files are kept in the
uploads folder and checked with tunedeck's data checks (`app.openai_tuning.files`). A run is shown as a job,
its metrics as events and its checkpoints as checkpoints (`app.openai_tuning.views`). The server adds the
routes: `app.openai_tuning.routes.add_tuning_routes`.
"""
