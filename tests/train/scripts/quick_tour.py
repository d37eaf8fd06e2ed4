# Accelerate's quick-tour pattern, unchanged except for the import line (issue 4: "done means").
import torch
from torch.utils.data import DataLoader, TensorDataset

from convoy import Accelerator  # was: from accelerate import Accelerator

accelerator = Accelerator()
device = accelerator.device
assert accelerator.num_processes == 2, f"num_processes={accelerator.num_processes}: not N independent copies"

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
x_all, y_all = torch.randn(96, 8, generator=g), torch.randint(0, 2, (96,), generator=g)
training_dataloader = DataLoader(TensorDataset(x_all, y_all), batch_size=8, shuffle=True)
eval_dataloader = DataLoader(TensorDataset(x_all[:21], y_all[:21]), batch_size=4)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
loss_function = torch.nn.CrossEntropyLoss()

model, optimizer, training_dataloader, scheduler, eval_dataloader = accelerator.prepare(
    model, optimizer, training_dataloader, scheduler, eval_dataloader
)

for _epoch in range(2):
    for batch in training_dataloader:
        optimizer.zero_grad()
        inputs, targets = batch
        inputs = inputs.to(device)
        targets = targets.to(device)
        outputs = model(inputs)
        loss = loss_function(outputs, targets)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()

model.eval()
all_predictions, all_targets = [], []
for inputs, targets in eval_dataloader:
    with torch.no_grad():
        predictions = model(inputs).argmax(-1)
    predictions, targets = accelerator.gather_for_metrics((predictions, targets))
    all_predictions.append(predictions)
    all_targets.append(targets)
assert torch.cat(all_targets).tolist() == y_all[:21].tolist(), "gather_for_metrics lost or repeated samples"

accelerator.wait_for_everyone()
unwrapped = accelerator.unwrap_model(model)
weights = accelerator.gather(unwrapped[0].weight.detach().reshape(1, -1))
assert torch.equal(weights[0], weights[1]), "replicas diverged"
accelerator.print("QUICK TOUR OK", scheduler.get_last_lr())
