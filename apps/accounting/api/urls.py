from django.urls import path

from apps.accounting.api import views

urlpatterns = [
    path("accounting/", views.AccountingApi.as_view(), name="accounting"),
    path("budgets/", views.BudgetListSetApi.as_view(), name="budgets"),
]
