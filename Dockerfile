# GPU image: runs any canonrl script or the benchmark on CUDA.
#   docker build -t canonrl .
#   docker run --gpus all canonrl                                       # python algos/ppo.py --cuda
#   docker run --gpus all canonrl python benchmark/run.py --suite classic --device cuda
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 OMP_NUM_THREADS=1 WANDB_MODE=offline
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3-pip git swig \
        build-essential libgl1 libglib2.0-0 && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /canonrl
COPY . .
# the CUDA build of the pinned torch comes from PyPI's default index here (CUDA 12.x wheels)
RUN pip install --upgrade pip && pip install torch==2.13.0 && pip install -e ".[dev]"
CMD ["python", "algos/ppo.py", "--cuda"]
